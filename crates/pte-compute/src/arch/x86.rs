//! x86-64 GEMM micro-kernels (AVX2+FMA 6×16 and AVX-512F 12×32) and the row kernel
//! of 3×3 and 5×5 depthwise convolutions in NHWC (one source, compiled for 8 and 16
//! lanes).
//!
//! Each keeps `rows × (nr / lanes)` accumulators in vector registers; a step of `p` loads
//! `nr / lanes` vectors of the B panel and broadcasts each of the `rows` values of the A
//! panel once. The number of rows is a const parameter, so an edge tile of fewer rows
//! runs a kernel of exactly that many rows (no wasted multiply-adds) with the same
//! packed A panel.

use std::arch::x86_64::*;

use super::RawPost;

pub(crate) const AVX2_MR: usize = 6;
pub(crate) const AVX2_NR: usize = 16;
pub(crate) const AVX512_MR: usize = 12;
pub(crate) const AVX512_NR: usize = 32;

/// Generates a kernel over `$v` vectors: `$name::<R>` plus a dispatcher on `rows`.
macro_rules! kernel {
    ($feat:literal, $name:ident, $dispatch:ident, $v:ty, $mr:expr, $nr:expr, $lanes:expr,
     $zero:ident, $load:ident, $store:ident, $set1:ident, $fmadd:ident, $add:ident, $max:ident, $min:ident,
     [$($r:literal)*]) => {
        /// # Safety
        /// The CPU has the features; `a` holds `kc * MR` values, `b` `kc * NR`, and
        /// `c` the tile `(i, j) -> c[i * rs + j]`, `i < R`, `j < NR`; a non-null
        /// `post.rows` holds R values, `post.cols` NR.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<const R: usize>(
            kc: usize,
            a: *const f32,
            b: *const f32,
            c: *mut f32,
            rs: usize,
            accumulate: bool,
            post: RawPost,
        ) {
            const V: usize = $nr / $lanes;
            let mut acc = [[$zero(); V]; R];
            for p in 0..kc {
                // SAFETY: p < kc, so the panel reads stay inside `a` and `b`.
                unsafe {
                    let bp = b.add(p * $nr);
                    let bv: [$v; V] = std::array::from_fn(|v| $load(bp.add(v * $lanes)));
                    let ap = a.add(p * $mr);
                    for (i, row) in acc.iter_mut().enumerate() {
                        let av = $set1(*ap.add(i));
                        for (x, &y) in row.iter_mut().zip(&bv) {
                            *x = $fmadd(av, y, *x);
                        }
                    }
                }
            }
            let (lo, hi) = ($set1(post.min), $set1(post.max));
            for (i, row) in acc.iter().enumerate() {
                // SAFETY: a row bias holds at least R values (checked by the caller).
                let rb = (post.on && !post.rows.is_null()).then(|| unsafe { $set1(*post.rows.add(i)) });
                for (v, &x) in row.iter().enumerate() {
                    // SAFETY: i < R, v * lanes < NR: inside the tile; a column bias
                    // holds NR values.
                    unsafe {
                        let cp = c.add(i * rs + v * $lanes);
                        let mut x = if accumulate { $add(x, $load(cp)) } else { x };
                        if post.on {
                            if let Some(rb) = rb {
                                x = $add(x, rb);
                            }
                            if !post.cols.is_null() {
                                x = $add(x, $load(post.cols.add(v * $lanes)));
                            }
                            // max(lo, x) and min(hi, x) return x when it is NaN.
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
            kc: usize,
            a: *const f32,
            b: *const f32,
            c: *mut f32,
            rs: usize,
            accumulate: bool,
            post: RawPost,
        ) {
            // SAFETY: forwarded contract.
            unsafe {
                match rows {
                    $($r => $name::<$r>(kc, a, b, c, rs, accumulate, post),)*
                    _ => $name::<$mr>(kc, a, b, c, rs, accumulate, post),
                }
            }
        }
    };
}

kernel!(
    "avx2,fma",
    avx2_tile,
    avx2_kernel,
    __m256,
    AVX2_MR,
    AVX2_NR,
    8,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps,
    _mm256_max_ps,
    _mm256_min_ps,
    [1 2 3 4 5]
);

kernel!(
    "avx512f,avx2,fma",
    avx512_tile,
    avx512_kernel,
    __m512,
    AVX512_MR,
    AVX512_NR,
    16,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    _mm512_max_ps,
    _mm512_min_ps,
    [1 2 3 4 5 6 7 8 9 10 11]
);

/// The geometry of one output row of a depthwise K×K convolution in NHWC.
#[derive(Clone, Copy)]
pub(crate) struct DwRow {
    /// Channels (the stride between pixels).
    pub c: usize,
    /// Output pixels of the row.
    pub ow: usize,
    /// Input width, horizontal stride, dilation and left padding.
    pub w_in: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad: usize,
    /// Clamp of the output.
    pub min: f32,
    pub max: f32,
}

/// Generates the depthwise row kernel over `$v` vectors of `$l` lanes in a module of
/// its own (one source for every vector width).
macro_rules! depthwise_rows {
    ($module:ident, $feat:literal, $v:ty, $l:literal, $load:ident, $store:ident,
     $fmadd:ident, $set1:ident, $zero:ident, $min:ident, $max:ident) => {
        pub(crate) mod $module {
            use std::arch::x86_64::*;

            use super::DwRow;

            /// Where the weight vectors of one block of channels come from, tap by tap.
            trait DwTaps: Copy {
                /// The weights of tap `t` (`ky · K + kx`).
                ///
                /// # Safety
                /// The instruction set is available and `t < K · K`.
                unsafe fn tap(self, t: usize) -> $v;
            }

            /// Registers: the nine vectors of a 3×3 window fit beside four accumulators.
            impl DwTaps for &[$v; 9] {
                #[inline(always)]
                unsafe fn tap(self, t: usize) -> $v {
                    // Out of range only against the contract; a zero vector keeps it a safe read.
                    self.get(t).copied().unwrap_or(unsafe { $zero() })
                }
            }

            /// Memory (L1-resident): larger windows would spill a register copy.
            #[derive(Clone, Copy)]
            struct TapsInMemory {
                /// The block's weights of tap 0; tap `t` is `c · t` floats further.
                w: *const f32,
                c: usize,
            }

            impl DwTaps for TapsInMemory {
                #[inline(always)]
                unsafe fn tap(self, t: usize) -> $v {
                    // SAFETY: t < K·K and the weights hold K·K·c floats (the caller's contract).
                    unsafe { $load(self.w.add(t * self.c)) }
                }
            }

            /// Depthwise K×K convolution (K = 3 or 5) of one output row, channels `c_lo..c_hi`
            /// in blocks of one vector. Pixels go by groups of four whose taps all lie inside the row
            /// (four independent accumulators; at stride 1 or 2 without dilation each input
            /// vector is loaded once and feeds every accumulator that reads it), the others one
            /// at a time with their taps checked; rows in the padding are skipped. A 3×3 block's
            /// nine weight vectors stay in registers while the group is computed; a 5×5 block's
            /// are read from memory.
            ///
            /// # Safety
            /// The instruction set is available; `c_lo` and `c_hi <= c` are multiples of the
            /// lanes. `rows[ky]` is null (a padded row) or points to `w_in * c` floats; `w` to
            /// `K * K * c` (`w[tap * c + ch]`), `bias` to `c`, `y` to `ow * c`.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn depthwise_row<const K: usize>(
                rows: [*const f32; K],
                w: *const f32,
                bias: *const f32,
                y: *mut f32,
                g: DwRow,
                (c_lo, c_hi): (usize, usize),
            ) {
                let (lo, hi) = ($set1(g.min), $set1(g.max));
                // Pixels whose K taps lie inside the row: ox·s ≥ pad and ox·s + (K-1)d - pad < w_in.
                let first = g.pad.div_ceil(g.stride);
                let end = (g.w_in + g.pad)
                    .checked_sub((K - 1) * g.dilation)
                    .map_or(0, |v| v.div_ceil(g.stride))
                    .min(g.ow);
                let mut ox = 0;
                while ox < g.ow {
                    if ox >= first && ox + 4 <= end {
                        let ix0 = ox * g.stride - g.pad;
                        for c0 in (c_lo..c_hi).step_by($l) {
                            let at = ix0 * g.c + c0;
                            // SAFETY: c0 + lanes <= c and tap * c + c0 + lanes <= K * K * c; every tap of
                            // the four pixels lies inside its row.
                            let acc = unsafe {
                                let bv = $load(bias.add(c0));
                                if K == 3 {
                                    let wv: [$v; 9] =
                                        std::array::from_fn(|t| $load(w.add(t * g.c + c0)));
                                    dw_group_of::<K, _>(rows, at, g, &wv, bv)
                                } else {
                                    let taps = TapsInMemory {
                                        w: w.add(c0),
                                        c: g.c,
                                    };
                                    dw_group_of::<K, _>(rows, at, g, taps, bv)
                                }
                            };
                            for (p, a) in acc.iter().enumerate() {
                                let v = $min(hi, $max(lo, *a));
                                // SAFETY: ox + p < ow and c0 + lanes <= c: inside y.
                                unsafe { $store(y.add((ox + p) * g.c + c0), v) };
                            }
                        }
                        ox += 4;
                        continue;
                    }
                    // A pixel near the edges, its taps checked: four blocks of channels at a time
                    // (one accumulator would be a chain of up to K·K dependent multiply-adds,
                    // bound by their latency), then one.
                    let mut c0 = c_lo;
                    while c0 + 4 * $l <= c_hi {
                        // SAFETY: c0 + 4 lanes <= c, ox < ow; forwarded contract.
                        unsafe { dw_edge_pixel::<K, 4>(rows, w, bias, y, g, ox, c0) };
                        c0 += 4 * $l;
                    }
                    while c0 + $l <= c_hi {
                        // SAFETY: c0 + lanes <= c, ox < ow; forwarded contract.
                        unsafe { dw_edge_pixel::<K, 1>(rows, w, bias, y, g, ox, c0) };
                        c0 += $l;
                    }
                    ox += 1;
                }
            }

            /// Output pixel `ox`, channels `c0..c0 + lanes·B`, of [`depthwise_row`], every tap
            /// checked against the row's ends.
            ///
            /// # Safety
            /// As [`depthwise_row`]'s, and `ox < ow`, `c0 + lanes·B <= c`.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn dw_edge_pixel<const K: usize, const B: usize>(
                rows: [*const f32; K],
                w: *const f32,
                bias: *const f32,
                y: *mut f32,
                g: DwRow,
                ox: usize,
                c0: usize,
            ) {
                // SAFETY: c0 + lanes·B <= c.
                let mut acc: [$v; B] =
                    std::array::from_fn(|b| unsafe { $load(bias.add(c0 + $l * b)) });
                for (ky, &row) in rows.iter().enumerate() {
                    if row.is_null() {
                        continue;
                    }
                    for kx in 0..K {
                        let Some(ix) = (ox * g.stride + kx * g.dilation)
                            .checked_sub(g.pad)
                            .filter(|&ix| ix < g.w_in)
                        else {
                            continue;
                        };
                        for (b, a) in acc.iter_mut().enumerate() {
                            // SAFETY: ix < w_in and c0 + lanes·B <= c: inside the row and the weights.
                            unsafe {
                                let xv = $load(row.add(ix * g.c + c0 + $l * b));
                                let wk = $load(w.add((ky * K + kx) * g.c + c0 + $l * b));
                                *a = $fmadd(xv, wk, *a);
                            }
                        }
                    }
                }
                let (lo, hi) = ($set1(g.min), $set1(g.max));
                for (b, a) in acc.iter().enumerate() {
                    let v = $min(hi, $max(lo, *a));
                    // SAFETY: ox < ow and c0 + lanes·B <= c: inside y.
                    unsafe { $store(y.add(ox * g.c + c0 + $l * b), v) };
                }
            }

            /// The group kernel for this row's stride and dilation.
            ///
            /// # Safety
            /// As [`dw_group`]'s and [`dw_group_any`]'s.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn dw_group_of<const K: usize, T: DwTaps>(
                rows: [*const f32; K],
                at: usize,
                g: DwRow,
                taps: T,
                bias: $v,
            ) -> [$v; 4] {
                // SAFETY: forwarded contract.
                unsafe {
                    match (g.stride, g.dilation) {
                        (1, 1) => dw_group::<K, 1, T>(rows, at, g.c, taps, bias),
                        (2, 1) => dw_group::<K, 2, T>(rows, at, g.c, taps, bias),
                        _ => dw_group_any::<K, T>(rows, at, g, taps, bias),
                    }
                }
            }

            /// Four pixels of a depthwise K×K row at stride `S` without dilation, from the input
            /// offset `at` of the first one's first tap (in floats, within each row): input
            /// pixel `j` feeds pixel `p` through tap `j - p·S`.
            ///
            /// # Safety
            /// The instruction set is available; each non-null row holds a vector at `at + j·c` for
            /// `j < 3·S + K`; `taps` has K·K taps.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn dw_group<const K: usize, const S: usize, T: DwTaps>(
                rows: [*const f32; K],
                at: usize,
                c: usize,
                taps: T,
                bias: $v,
            ) -> [$v; 4] {
                let mut acc = [bias; 4];
                for (ky, &row) in rows.iter().enumerate() {
                    if row.is_null() {
                        continue;
                    }
                    for j in 0..3 * S + K {
                        // SAFETY: j < 3·S + K: inside the row.
                        let xv = unsafe { $load(row.add(at + j * c)) };
                        for (p, a) in acc.iter_mut().enumerate() {
                            if let Some(kx) = j.checked_sub(p * S).filter(|&kx| kx < K) {
                                // SAFETY: ky·K + kx < K·K.
                                *a = $fmadd(xv, unsafe { taps.tap(ky * K + kx) }, *a);
                            }
                        }
                    }
                }
                acc
            }

            /// [`dw_group`] for any stride and dilation: every tap loaded on its own.
            ///
            /// # Safety
            /// The instruction set is available; each non-null row holds a vector at `at + (p·s +
            /// kx·d)·c` for `p < 4`, `kx < K`; `taps` has K·K taps.
            #[target_feature(enable = $feat)]
            unsafe fn dw_group_any<const K: usize, T: DwTaps>(
                rows: [*const f32; K],
                at: usize,
                g: DwRow,
                taps: T,
                bias: $v,
            ) -> [$v; 4] {
                let mut acc = [bias; 4];
                for (ky, &row) in rows.iter().enumerate() {
                    if row.is_null() {
                        continue;
                    }
                    for kx in 0..K {
                        // SAFETY: ky·K + kx < K·K.
                        let wk = unsafe { taps.tap(ky * K + kx) };
                        for (p, a) in acc.iter_mut().enumerate() {
                            let ix = p * g.stride + kx * g.dilation;
                            // SAFETY: inside the row, by the contract.
                            let xv = unsafe { $load(row.add(at + ix * g.c)) };
                            *a = $fmadd(xv, wk, *a);
                        }
                    }
                }
                acc
            }
        }
    };
}

depthwise_rows!(
    dw256,
    "avx2,fma",
    __m256,
    8,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_fmadd_ps,
    _mm256_set1_ps,
    _mm256_setzero_ps,
    _mm256_min_ps,
    _mm256_max_ps
);
depthwise_rows!(
    dw512,
    "avx512f,avx2,fma",
    __m512,
    16,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_fmadd_ps,
    _mm512_set1_ps,
    _mm512_setzero_ps,
    _mm512_min_ps,
    _mm512_max_ps
);

/// `dst[j·ds + i] = src[i·ss + j]` for `i, j < 8`: an 8 × 8 block of 32-bit values
/// transposed in registers (unpacks, shuffles, lane permutes; bits moved unchanged).
///
/// # Safety
/// AVX2 is available; `src` holds 8 rows of 8 values `ss` apart, `dst` 8 rows `ds` apart.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose8x8(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    // SAFETY: row i < 8 of src is inside (the caller's contract).
    let [r0, r1, r2, r3, r4, r5, r6, r7]: [__m256; 8] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src.add(i * ss)) });
    // Pairs of rows interleaved, per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3).
    let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
    let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
    let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
    let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
    // Column j of four rows per lane: u_j for rows 0..4, w_j for rows 4..8.
    let u = [
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xEE>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xEE>(t1, t3),
    ];
    let w = [
        _mm256_shuffle_ps::<0x44>(t4, t6),
        _mm256_shuffle_ps::<0xEE>(t4, t6),
        _mm256_shuffle_ps::<0x44>(t5, t7),
        _mm256_shuffle_ps::<0xEE>(t5, t7),
    ];
    // Low lanes give columns 0..4, high lanes columns 4..8.
    for (j, (&a, &b)) in u.iter().zip(&w).enumerate() {
        let lo = _mm256_permute2f128_ps::<0x20>(a, b);
        let hi = _mm256_permute2f128_ps::<0x31>(a, b);
        // SAFETY: rows j and j + 4 < 8 of dst are inside (the caller's contract).
        unsafe {
            _mm256_storeu_ps(dst.add(j * ds), lo);
            _mm256_storeu_ps(dst.add((j + 4) * ds), hi);
        }
    }
}
