//! x86-64 GEMM micro-kernels (AVX2+FMA 6×16 and AVX-512F 12×32), the row kernel of
//! 3×3 and 5×5 depthwise convolutions in NHWC (one source, compiled for 8 and 16
//! lanes), and the AVX-512 kernel of NCHW depthwise convolutions at stride 1.
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

/// Bytes ahead of the depth step being multiplied that the product kernels prefetch
/// their packed weights from. Constant weights come from memory once per execution,
/// and the first row tile to read a block of panels otherwise waits on each of its
/// cache lines: cold 1×1 convolutions with 8 MB of weights over 49 pixels (resnext50's
/// last stage) ran at 95 GFLOP/s, 108 with the prefetch (interleaved, 3 rounds).
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Prefetches into L1 the `bytes` bytes [`PREFETCH_AHEAD`] bytes past `p`, a cache
/// line at a time.
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, bytes: usize) {
    let ahead = p.wrapping_add(PREFETCH_AHEAD).cast::<i8>();
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint; it does not fault on any address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line)) };
    }
}

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
    ($module:ident, $feat:literal, $v:ty, $l:literal, $register_taps:literal, $load:path,
     $store:path, $fmadd:path, $set1:path, $zero:path, $min:path, $max:path,
     $add:path) => {
        pub(crate) mod $module {
            // The paired kernel names its operations by path, using none of these.
            #[allow(unused_imports)]
            use std::arch::x86_64::*;

            use super::DwRow;

            /// Depthwise K×K convolution (K = 3 or 5) of one output row, channels `c_lo..c_hi`.
            ///
            /// One block of channels (one `$v`) at a time, sliding along the row: the
            /// block's row pointers and bias (and, for kernels of at most `$register_taps`
            /// rows, the window's weight vectors) stay in registers while pixels go by
            /// groups of up to four whose taps all lie inside
            /// the row (independent accumulators; at stride 1 or 2 without dilation each
            /// input vector is loaded once and feeds every accumulator that reads it), the
            /// pixels near the ends one at a time with their taps checked; rows in the
            /// padding are skipped. The loop keeps K row pointers and the tap offsets live;
            /// walking the channels innermost instead kept one address per tap of a group,
            /// spilled: 3×3 rows took 1.2-3.5× this kernel's time, in cache, timed in one
            /// process. (5×5 rows, their weights read from L1, time about as before: 0.9-1.3×
            /// in isolation; every model with such layers that we timed gained.)
            ///
            /// # Safety
            /// The instruction set is available; `c_hi <= c` and `c_hi - c_lo` is a multiple
            /// of the lanes. `rows[ky]` is null (a padded row) or points to `w_in * c` floats; `w` to
            /// `K * K * c` (`w[tap * c + ch]`), `bias` to `c`, `y` to `ow * c`.
            #[target_feature(enable = $feat)]
            pub(crate) unsafe fn depthwise_row<const K: usize>(
                rows: [*const f32; K],
                w: *const f32,
                bias: *const f32,
                y: *mut f32,
                g: DwRow,
                channels: (usize, usize),
            ) {
                let io = (rows, w, bias, y);
                // SAFETY: forwarded contract.
                unsafe {
                    match (g.stride, g.dilation) {
                        (1, 1) => blocks::<K, _>(io, g, channels, Fixed::<1>),
                        (2, 1) => blocks::<K, _>(io, g, channels, Fixed::<2>),
                        (s, d) => blocks::<K, _>(io, g, channels, AnySteps(s, d)),
                    }
                }
            }

            /// [`depthwise_row`] for one kind of [`Steps`], block by block of channels.
            ///
            /// # Safety
            /// As [`depthwise_row`]'s; `st` gives the row's stride and dilation.
            #[target_feature(enable = $feat)]
            unsafe fn blocks<const K: usize, S: Steps>(
                (rows, w, bias, y): ([*const f32; K], *const f32, *const f32, *mut f32),
                g: DwRow,
                (c_lo, c_hi): (usize, usize),
                st: S,
            ) {
                for c0 in (c_lo..c_hi).step_by($l) {
                    // SAFETY: c0 + lanes <= c: the block's columns of every row, of the
                    // weights, the bias and the output.
                    unsafe {
                        let block = Block {
                            rows: rows.map(|r| if r.is_null() { r } else { r.add(c0) }),
                            bias: $load(bias.add(c0)),
                            y: y.add(c0),
                        };
                        if K <= $register_taps {
                            let taps: [[$v; K]; K] = std::array::from_fn(|ky| {
                                std::array::from_fn(|kx| $load(w.add((ky * K + kx) * g.c + c0)))
                            });
                            slide::<K, S, _>(block, g, &taps, st);
                        } else {
                            slide::<K, S, _>(
                                block,
                                g,
                                TapsInMemory {
                                    w: w.add(c0),
                                    c: g.c,
                                },
                                st,
                            );
                        }
                    }
                }
            }

            /// Where the weight vectors of one block of channels come from, tap by tap.
            trait DwTaps<const K: usize>: Copy {
                /// The weights of tap `(ky, kx)`.
                ///
                /// # Safety
                /// The instruction set is available and `ky, kx < K`.
                unsafe fn tap(self, ky: usize, kx: usize) -> $v;
            }

            /// Registers: the nine vectors of a 3×3 window, loaded once per block.
            impl<const K: usize> DwTaps<K> for &[[$v; K]; K] {
                #[inline(always)]
                unsafe fn tap(self, ky: usize, kx: usize) -> $v {
                    // Out of range only against the contract; a zero vector keeps it a safe read.
                    let tap = self.get(ky).and_then(|r| r.get(kx)).copied();
                    tap.unwrap_or(unsafe { $zero() })
                }
            }

            /// Memory (L1-resident): a larger window's copy would spill.
            #[derive(Clone, Copy)]
            struct TapsInMemory {
                /// The block's weights of tap 0; tap `t` is `c · t` floats further.
                w: *const f32,
                c: usize,
            }

            impl<const K: usize> DwTaps<K> for TapsInMemory {
                #[inline(always)]
                unsafe fn tap(self, ky: usize, kx: usize) -> $v {
                    // SAFETY: ky·K + kx < K·K and the weights hold K·K·c floats.
                    unsafe { $load(self.w.add((ky * K + kx) * self.c)) }
                }
            }

            /// One block of channels of [`depthwise_row`]: its first channel's address in
            /// each input row (null: padding) and in the output row, and its bias.
            #[derive(Clone, Copy)]
            struct Block<const K: usize> {
                rows: [*const f32; K],
                bias: $v,
                y: *mut f32,
            }

            /// The stride and dilation of a row: constants for the common cases (so that
            /// a group's repeated taps merge into one load), else the row's.
            trait Steps: Copy {
                fn stride(self) -> usize;
                fn dilation(self) -> usize;
            }

            /// Stride `S`, no dilation.
            #[derive(Clone, Copy)]
            struct Fixed<const S: usize>;

            impl<const S: usize> Steps for Fixed<S> {
                #[inline(always)]
                fn stride(self) -> usize {
                    S
                }
                #[inline(always)]
                fn dilation(self) -> usize {
                    1
                }
            }

            /// Any stride and dilation.
            #[derive(Clone, Copy)]
            struct AnySteps(usize, usize);

            impl Steps for AnySteps {
                #[inline(always)]
                fn stride(self) -> usize {
                    self.0
                }
                #[inline(always)]
                fn dilation(self) -> usize {
                    self.1
                }
            }

            /// One block's output row: its pixels in groups of four, the ends one by one.
            ///
            /// # Safety
            /// As [`depthwise_row`]'s, for the block; `st` gives the row's stride and dilation.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn slide<const K: usize, S: Steps, T: DwTaps<K>>(
                b: Block<K>,
                g: DwRow,
                taps: T,
                st: S,
            ) {
                let (lo, hi) = ($set1(g.min), $set1(g.max));
                let (s, d, c) = (st.stride(), st.dilation(), g.c);
                // Pixels whose K taps lie inside the row: ox·s ≥ pad and ox·s + (K-1)d - pad < w_in.
                let first = g.pad.div_ceil(s).min(g.ow);
                let end = (g.w_in + g.pad)
                    .checked_sub((K - 1) * d)
                    .map_or(0, |v| v.div_ceil(s))
                    .clamp(first, g.ow);
                let put = |y: *mut f32, v: $v| {
                    // SAFETY: the callers pass pixels of the output row.
                    unsafe { $store(y, $min(hi, $max(lo, v))) }
                };
                for ox in 0..first {
                    // SAFETY: ox < ow; forwarded contract.
                    put(unsafe { b.y.add(ox * c) }, unsafe {
                        edge_pixel::<K, S, T>(b, g, taps, st, ox)
                    });
                }
                // Interior pixels: the rows' pointers at the group's first tap and the
                // output pointer advance with the group (loop-carried, so that the loop
                // keeps K row pointers and the tap offsets live, not one address per tap).
                let mut ox = first;
                let skip = (first * s).saturating_sub(g.pad) * c;
                // SAFETY: skip < w_in · c and first <= ow: inside the rows and the output.
                let (mut rows, mut y) = unsafe {
                    (
                        b.rows.map(|r| if r.is_null() { r } else { r.add(skip) }),
                        b.y.add(first * c),
                    )
                };
                while ox + 4 <= end {
                    // SAFETY: pixels ox..ox + 4 are interior, inside the output row.
                    unsafe {
                        let acc = group::<K, 4, S, T>(rows, b.bias, c, taps, st);
                        for (p, v) in acc.into_iter().enumerate() {
                            put(y.add(p * c), v);
                        }
                        y = y.add(4 * c);
                        rows = rows.map(|r| if r.is_null() { r } else { r.add(4 * s * c) });
                    }
                    ox += 4;
                }
                // SAFETY: the remaining interior pixels, fewer than four.
                unsafe {
                    let rest = |acc: &[$v]| {
                        for (p, &v) in acc.iter().enumerate() {
                            put(y.add(p * c), v);
                        }
                    };
                    match end - ox {
                        3 => rest(&group::<K, 3, S, T>(rows, b.bias, c, taps, st)),
                        2 => rest(&group::<K, 2, S, T>(rows, b.bias, c, taps, st)),
                        1 => rest(&group::<K, 1, S, T>(rows, b.bias, c, taps, st)),
                        _ => {}
                    }
                }
                for ox in end..g.ow {
                    // SAFETY: ox < ow; forwarded contract.
                    put(unsafe { b.y.add(ox * c) }, unsafe {
                        edge_pixel::<K, S, T>(b, g, taps, st, ox)
                    });
                }
            }

            /// `P` interior pixels whose first tap is at `rows` (null: a padded row): input
            /// column `p·s + kx·d` (counted from there) feeds pixel `p` through tap `kx`.
            ///
            /// # Safety
            /// As [`depthwise_row`]'s; every tap of the `P` pixels lies inside the row.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn group<const K: usize, const P: usize, S: Steps, T: DwTaps<K>>(
                rows: [*const f32; K],
                bias: $v,
                c: usize,
                taps: T,
                st: S,
            ) -> [$v; P] {
                let mut acc = [bias; P];
                for (ky, &row) in rows.iter().enumerate() {
                    if row.is_null() {
                        continue;
                    }
                    for kx in 0..K {
                        // SAFETY: ky·K + kx < K·K.
                        let wk = unsafe { taps.tap(ky, kx) };
                        for (p, a) in acc.iter_mut().enumerate() {
                            let j = p * st.stride() + kx * st.dilation();
                            // SAFETY: an interior pixel's tap: inside the row.
                            let xv = unsafe { $load(row.add(j * c)) };
                            *a = $fmadd(xv, wk, *a);
                        }
                    }
                }
                acc
            }

            /// Output pixel `ox` with every tap checked against the row's ends; one
            /// accumulator per kernel row, so that the sum is not one chain of K·K
            /// dependent multiply-adds.
            ///
            /// # Safety
            /// As [`depthwise_row`]'s, and `ox < ow`.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn edge_pixel<const K: usize, S: Steps, T: DwTaps<K>>(
                b: Block<K>,
                g: DwRow,
                taps: T,
                st: S,
                ox: usize,
            ) -> $v {
                let mut acc = [$zero(); K];
                // The taps inside the row, kx in lo..hi: input column ox·s + kx·d - pad
                // in 0..w_in (found once, not tap by tap).
                let (x0, d) = (ox * st.stride(), st.dilation().max(1));
                let lo = g.pad.saturating_sub(x0).div_ceil(d).min(K);
                let hi = (g.w_in + g.pad)
                    .checked_sub(x0)
                    .map_or(0, |room| room.div_ceil(d))
                    .clamp(lo, K);
                for ((ky, &row), a) in b.rows.iter().enumerate().zip(acc.iter_mut()) {
                    if row.is_null() {
                        continue;
                    }
                    // All K taps, those outside lo..hi skipped: a loop of constant length,
                    // unrolled (a loop over lo..hi made 3×3 rows 5-25% slower).
                    for kx in (0..K).filter(|kx| (lo..hi).contains(kx)) {
                        let ix = x0 + kx * d - g.pad;
                        // SAFETY: lo..hi keeps ix in 0..w_in: inside the row; ky·K + kx < K·K.
                        unsafe { *a = $fmadd($load(row.add(ix * g.c)), taps.tap(ky, kx), *a) };
                    }
                }
                acc.into_iter().fold(b.bias, |s, a| $add(s, a))
            }
        }
    };
}

depthwise_rows!(
    dw256,
    "avx2,fma",
    __m256,
    8,
    3,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_fmadd_ps,
    _mm256_set1_ps,
    _mm256_setzero_ps,
    _mm256_min_ps,
    _mm256_max_ps,
    _mm256_add_ps
);
depthwise_rows!(
    dw512,
    "avx512f,avx2,fma",
    __m512,
    16,
    3,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_fmadd_ps,
    _mm512_set1_ps,
    _mm512_setzero_ps,
    _mm512_min_ps,
    _mm512_max_ps,
    _mm512_add_ps
);

/// Sixteen channels as two AVX2 vectors, for [`dw256x2`]: each cache line of a pixel's
/// channels is read whole by one block of channels, where blocks of eight read each
/// line twice, a whole band of rows apart (out of L1 by then).
mod pair {
    use std::arch::x86_64::*;

    pub(crate) type Pair = [__m256; 2];

    /// # Safety
    /// AVX2 is available; `p` points to 16 floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn load(p: *const f32) -> Pair {
        // SAFETY: forwarded contract.
        unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
    }

    /// # Safety
    /// AVX2 is available; `p` points to 16 writable floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn store(p: *mut f32, [a, b]: Pair) {
        // SAFETY: forwarded contract.
        unsafe {
            _mm256_storeu_ps(p, a);
            _mm256_storeu_ps(p.add(8), b);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn fmadd([a0, a1]: Pair, [b0, b1]: Pair, [c0, c1]: Pair) -> Pair {
        [_mm256_fmadd_ps(a0, b0, c0), _mm256_fmadd_ps(a1, b1, c1)]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn set1(v: f32) -> Pair {
        [_mm256_set1_ps(v); 2]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn zero() -> Pair {
        [_mm256_setzero_ps(); 2]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn min([a0, a1]: Pair, [b0, b1]: Pair) -> Pair {
        [_mm256_min_ps(a0, b0), _mm256_min_ps(a1, b1)]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn max([a0, a1]: Pair, [b0, b1]: Pair) -> Pair {
        [_mm256_max_ps(a0, b0), _mm256_max_ps(a1, b1)]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn add([a0, a1]: Pair, [b0, b1]: Pair) -> Pair {
        [_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1)]
    }
}

// Taps read from L1 at every size: eighteen vectors of a 3×3 window would spill.
depthwise_rows!(
    dw256x2,
    "avx2,fma",
    super::pair::Pair,
    16,
    0,
    super::pair::load,
    super::pair::store,
    super::pair::fmadd,
    super::pair::set1,
    super::pair::zero,
    super::pair::min,
    super::pair::max,
    super::pair::add
);

/// `dst[j·ds + i] = src[i·ss + j]` for `i < rows`, `j < cols` (32-bit values, bits
/// unchanged): whole 8 × 8 blocks on register transposes, eight columns at a time over
/// all rows (each output row receives whole cache lines), the edges value by value.
/// One call for a whole block: a call per 8 × 8 block, not inlined, cost as much as
/// the moves on the small transposes of a network (7 × 7 × 464).
///
/// # Safety
/// AVX2 is available; `src` holds `rows` rows of `cols` values `ss` apart, `dst`
/// `cols` rows of `rows` values `ds` apart.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose32(
    src: *const f32,
    ss: usize,
    dst: *mut f32,
    ds: usize,
    rows: usize,
    cols: usize,
) {
    let (whole_rows, whole_cols) = (rows / 8 * 8, cols / 8 * 8);
    // SAFETY (every access below): i < rows and j < cols, inside by the caller's contract.
    for j0 in (0..whole_cols).step_by(8) {
        for i0 in (0..whole_rows).step_by(8) {
            unsafe { transpose8x8(src.add(i0 * ss + j0), ss, dst.add(j0 * ds + i0), ds) };
        }
        for i in whole_rows..rows {
            for j in j0..j0 + 8 {
                unsafe { *dst.add(j * ds + i) = *src.add(i * ss + j) };
            }
        }
    }
    for j in whole_cols..cols {
        for i in 0..rows {
            unsafe { *dst.add(j * ds + i) = *src.add(i * ss + j) };
        }
    }
}

/// `dst[j·ds + i] = src[i·ss + j]` for `i, j < 8`: an 8 × 8 block of 32-bit values
/// transposed in registers (unpacks, shuffles, lane permutes; bits moved unchanged).
///
/// # Safety
/// AVX2 is available; `src` holds 8 rows of 8 values `ss` apart, `dst` 8 rows `ds` apart.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose8x8(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
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

/// `dst[j·ds + i] = src[i·ss + j]` for `i, j < 16`: a 16 × 16 block of bytes
/// transposed in four rounds of unpacks (bytes, pairs, quads, then halves of rows
/// paired), SSE2 only.
///
/// # Safety
/// `src` holds 16 rows of 16 bytes `ss` apart, `dst` 16 rows `ds` apart.
pub(crate) unsafe fn transpose16x16_bytes(src: *const u8, ss: usize, dst: *mut u8, ds: usize) {
    let zero = _mm_setzero_si128();
    // SAFETY: row i < 16 of src is inside (the caller's contract).
    let rows: [__m128i; 16] =
        std::array::from_fn(|i| unsafe { _mm_loadu_si128(src.add(i * ss).cast()) });
    // Pairs of rows k: bytes interleaved, columns 0-7 then 8-15.
    let mut t = [zero; 16];
    for (o, r) in t.chunks_exact_mut(2).zip(rows.chunks_exact(2)) {
        if let ([o0, o1], [a, b]) = (o, r) {
            (*o0, *o1) = (_mm_unpacklo_epi8(*a, *b), _mm_unpackhi_epi8(*a, *b));
        }
    }
    // Quads of rows: columns 0-3, 4-7, 8-11, 12-15, four bytes (rows) each.
    let mut q = [zero; 16];
    for (o, p) in q.chunks_exact_mut(4).zip(t.chunks_exact(4)) {
        if let ([o0, o1, o2, o3], [a, b, c, d]) = (o, p) {
            (*o0, *o1) = (_mm_unpacklo_epi16(*a, *c), _mm_unpackhi_epi16(*a, *c));
            (*o2, *o3) = (_mm_unpacklo_epi16(*b, *d), _mm_unpackhi_epi16(*b, *d));
        }
    }
    // Halves (rows 0-7, 8-15): two columns of eight bytes per vector, in order.
    let mut h = [zero; 16];
    for (o, p) in h.chunks_exact_mut(8).zip(q.chunks_exact(8)) {
        let (lo, hi) = p.split_at(4);
        for ((o, a), b) in o.chunks_exact_mut(2).zip(lo).zip(hi) {
            if let [o0, o1] = o {
                (*o0, *o1) = (_mm_unpacklo_epi32(*a, *b), _mm_unpackhi_epi32(*a, *b));
            }
        }
    }
    // Column 2i from the halves' vectors i, and 2i + 1.
    let (top, bottom) = h.split_at(8);
    for (i, (a, b)) in top.iter().zip(bottom).enumerate() {
        // SAFETY: rows 2i and 2i + 1 < 16 of dst are inside (the caller's contract).
        unsafe {
            _mm_storeu_si128(dst.add(2 * i * ds).cast(), _mm_unpacklo_epi64(*a, *b));
            _mm_storeu_si128(dst.add((2 * i + 1) * ds).cast(), _mm_unpackhi_epi64(*a, *b));
        }
    }
}

/// Depthwise K×K convolutions of NCHW planes, stride and dilation 1, on AVX-512: each
/// input row is loaded once per 16 outputs (two vectors) and its K shifted runs cut
/// from them in registers, where runs loaded one by one from memory mostly straddled
/// two cache lines; each run serves every output row of the group it reaches.
pub(crate) mod dw_plane {
    use std::arch::x86_64::*;

    use super::super::DW_PLANE_ROWS as MAX_ROWS;

    /// Lanes `0..n` (all sixteen from `n >= 16`).
    fn mask(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// Lanes `s..s + 16` of the 32 lanes `a` then `b` (`s <= 6`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn shifted(a: __m512, b: __m512, s: usize) -> __m512 {
        let (a, b) = (_mm512_castps_si512(a), _mm512_castps_si512(b));
        _mm512_castsi512_ps(match s {
            1 => _mm512_alignr_epi32::<1>(b, a),
            2 => _mm512_alignr_epi32::<2>(b, a),
            3 => _mm512_alignr_epi32::<3>(b, a),
            4 => _mm512_alignr_epi32::<4>(b, a),
            5 => _mm512_alignr_epi32::<5>(b, a),
            6 => _mm512_alignr_epi32::<6>(b, a),
            _ => a,
        })
    }

    /// `R` output rows of `ow` values at `out` (row stride `ow`): output `(r, x)` is
    /// `bias + Σ w[ky·K + kx] · rows[r + ky][x + kx]`, a null row reading as zeros.
    ///
    /// # Safety
    /// AVX-512F is available; `K <= 7`, `R + K - 1 <= MAX_ROWS`; every non-null row of
    /// the first `R + K - 1` holds `len >= ow + K - 1` values; `w` holds `K · K`
    /// values and `out` `R · ow`.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn rows<const K: usize, const R: usize>(
        rows: &[*const f32; MAX_ROWS],
        len: usize,
        w: *const f32,
        bias: f32,
        out: *mut f32,
        ow: usize,
    ) {
        for c0 in (0..ow).step_by(16) {
            let mut acc = [_mm512_set1_ps(bias); R];
            let have = len - c0;
            for (j, &p) in rows.iter().enumerate().take(R + K - 1) {
                if p.is_null() {
                    continue;
                }
                // SAFETY: masked lanes stay inside the row's `len` values (masked-off
                // lanes are not read; their addresses are only computed).
                let (a, b) = unsafe {
                    (
                        _mm512_maskz_loadu_ps(mask(have), p.wrapping_add(c0)),
                        _mm512_maskz_loadu_ps(
                            mask(have.saturating_sub(16)),
                            p.wrapping_add(c0 + 16),
                        ),
                    )
                };
                for kx in 0..K {
                    let s = shifted(a, b, kx);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        if let Some(ky) = j.checked_sub(r).filter(|&ky| ky < K) {
                            // SAFETY: ky, kx < K: inside the K · K weights.
                            let t = unsafe { _mm512_set1_ps(*w.add(ky * K + kx)) };
                            *acc = _mm512_fmadd_ps(s, t, *acc);
                        }
                    }
                }
            }
            let m = mask(ow - c0);
            for (r, acc) in acc.iter().enumerate() {
                // SAFETY: lanes c0.. of row r, below ow: inside `out`.
                unsafe { _mm512_mask_storeu_ps(out.add(r * ow + c0), m, *acc) };
            }
        }
    }
}
