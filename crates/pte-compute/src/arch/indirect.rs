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

/// Taps one call of the float kernels combines (larger windows take several calls,
/// accumulating).
pub(crate) const MAX_TAPS: usize = 32;
/// Taps an [`IndirectRows`] may hold: a 9 × 9 window in one call, for the 8-bit kernel
/// whose store requantizes the whole sum.
pub(crate) const MAX_ROW_TAPS: usize = 81;
/// Largest mr of any instruction set.
const MAX_MR: usize = 12;

/// Tiles of at most `mr` rows covering `rows` rows: `(first row, rows)` of each. Tiles
/// of `mr` rows, unless the last would hold fewer than `fewest`: then as even as they
/// can be. A last tile of one row (regnet's 7 × 7 = 49 pixels in tiles of 12) runs
/// its few multiply-adds at their latency, not their throughput, and costs a third of
/// a whole tile; tiles of 10, 10, 10, 10 and 9 rows do not. Whole tiles amortise a
/// depth step's loads over more rows: 28 pixels as 12, 12 and 4 took 5% less than as
/// 10, 9 and 9 on the one-vector grouped kernel, which four rows keep busy.
pub(crate) fn even_tiles(
    rows: usize,
    mr: usize,
    fewest: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let mr = mr.max(1);
    let count = rows.div_ceil(mr);
    let (base, extra) = match rows % mr {
        last if last == 0 || last >= fewest => (mr, 0),
        _ => (rows / count.max(1), rows % count.max(1)),
    };
    (0..count).map(move |t| {
        let first = t * base + t.min(extra);
        (first, (base + usize::from(t < extra)).min(rows - first))
    })
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::super::RawPost;
    use super::RowPtrs;

    /// `$unroll` depth steps per turn of the loop. AVX2 takes four. On AVX-512, the
    /// twelve-row tile unrolled four times had its 48 broadcasts hoisted ahead of the
    /// multiply-adds and spilled to the stack with the accumulators (140 spills in the
    /// strided instance, rustc 1.95): one step per turn ran 1×1 convolutions 1.2-2.2
    /// times faster (384 → 64 channels at 14 × 14: 36-55 → 79-90 GFLOP/s, one thread).
    macro_rules! kernel {
        ($feat:literal, $name:ident, $dispatch:ident, $put:ident, $v:ty, $mr:expr, $nr:expr, $lanes:expr,
         $unroll:literal, $zero:ident, $load:ident, $store:ident, $set1:ident, $fmadd:ident, $add:ident, $max:ident, $min:ident,
         $loadn:ident, $storen:ident, [$($r:literal)*]) => {
            /// # Safety
            /// The CPU has the features; `a` gives `R` rows of at least `kc` values
            /// for each of `taps` taps; panel `q < panels` of
            /// `b` holds `taps * kc * NR` values from `b + q * stride`; `c` the tile
            /// `(i, j) -> c[i * rs + j]`, `i < R`, `j < (panels - 1) * NR + cols`
            /// (`1 <= cols <= NR`); a non-null `post.cols` holds as many values.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $name<const R: usize, A: RowPtrs<f32>>(
                taps: usize,
                kc: usize,
                a: A,
                (b, stride, panels, cols): (*const f32, usize, usize, usize),
                c: *mut f32,
                rs: usize,
                accumulate: bool,
                post: RawPost,
            ) {
                // Two vectors per row of a panel; a last panel of at most NR / 2
                // columns multiplies only the first.
                const _: () = assert!($nr == 2 * $lanes);
                for q in 0..panels {
                    // SAFETY: q < panels: panel q, column q * NR of the tile and its bias.
                    let (bq, cq, bias) = unsafe {
                        let bias = if post.cols.is_null() { post.cols } else { post.cols.add(q * $nr) };
                        (b.add(q * stride), c.add(q * $nr), bias)
                    };
                    let args = (taps, kc, a, bq, accumulate, post);
                    let cols = if q + 1 < panels { $nr } else { cols };
                    // SAFETY: `cols` columns inside the tile and its bias; the last
                    // vector's lanes past them are masked off.
                    unsafe {
                        if cols <= $lanes {
                            $put::<R, 1, A>(args, (cq, rs, cols), bias);
                        } else {
                            $put::<R, 2, A>(args, (cq, rs, cols - $lanes), bias);
                        }
                    }
                }
            }

            /// One panel: the first `W` vectors of each row of the `R × NR` tile at
            /// `c` (+)= the product, then bias and clamp; only the first `last` lanes
            /// of the last vector are read and written.
            ///
            /// # Safety
            /// As the kernel for one panel at `b`; `c` holds the tile's `W - 1`
            /// vectors and `last` values (`1 <= last <= LANES`) per row, at row stride
            /// `rs`; a non-null `bias` holds as many.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn $put<const R: usize, const W: usize, A: RowPtrs<f32>>(
                (taps, kc, a, b, accumulate, post): (usize, usize, A, *const f32, bool, RawPost),
                (c, rs, last): (*mut f32, usize, usize),
                bias: *const f32,
            ) {
                let mut acc = [[$zero(); W]; R];
                for t in 0..taps {
                    // SAFETY: t < taps, i < R: rows the source holds.
                    let rows: [*const f32; R] = std::array::from_fn(|i| unsafe { a.row(t, i, R) });
                    // SAFETY: t * kc + p < taps * kc: inside the panel.
                    let bt = unsafe { b.add(t * kc * $nr) };
                    let step = |p: usize, acc: &mut [[$v; W]; R]| {
                        // SAFETY: p < kc: inside each row and the panel.
                        unsafe {
                            let bp = bt.add(p * $nr);
                            super::super::x86::prefetch_ahead(bp.cast(), $nr * 4);
                            let bv: [$v; W] = std::array::from_fn(|v| $load(bp.add(v * $lanes)));
                            for (row, &ap) in acc.iter_mut().zip(&rows) {
                                let av = $set1(*ap.add(p));
                                for (x, &y) in row.iter_mut().zip(&bv) {
                                    *x = $fmadd(av, y, *x);
                                }
                            }
                        }
                    };
                    let mut p = 0;
                    while kc - p >= $unroll {
                        for u in 0..$unroll {
                            step(p + u, &mut acc);
                        }
                        p += $unroll;
                    }
                    while p < kc {
                        step(p, &mut acc);
                        p += 1;
                    }
                }
                let (lo, hi) = ($set1(post.min), $set1(post.max));
                for (i, row) in acc.iter().enumerate() {
                    for (v, &x) in row.iter().enumerate() {
                        let n = if v + 1 < W { $lanes } else { last };
                        // SAFETY: inside the tile and the bias: the first `n` lanes.
                        unsafe {
                            let cp = c.add(i * rs + v * $lanes);
                            let mut x = if accumulate { $add(x, $loadn(cp, n)) } else { x };
                            if post.on {
                                if !bias.is_null() {
                                    x = $add(x, $loadn(bias.add(v * $lanes), n));
                                }
                                x = $min(hi, $max(lo, x));
                            }
                            $storen(cp, n, x);
                        }
                    }
                }
            }

            /// # Safety
            /// As the kernel, with `1 <= rows <= MR`.
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn $dispatch<A: RowPtrs<f32>>(
                rows: usize,
                taps: usize,
                kc: usize,
                a: A,
                b: (*const f32, usize, usize, usize),
                c: *mut f32,
                rs: usize,
                accumulate: bool,
                post: RawPost,
            ) {
                // SAFETY: forwarded contract.
                unsafe {
                    match rows {
                        $($r => $name::<$r, A>(taps, kc, a, b, c, rs, accumulate, post),)*
                        _ => $name::<$mr, A>(taps, kc, a, b, c, rs, accumulate, post),
                    }
                }
            }
        };
    }

    kernel!(
        "avx2,fma", avx2_tile, avx2, avx2_put, __m256, 6, 16, 8, 4,
        _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
        _mm256_fmadd_ps, _mm256_add_ps, _mm256_max_ps, _mm256_min_ps,
        avx2_load_first, avx2_store_first, [1 2 3 4 5]
    );

    kernel!(
        "avx512f,avx2,fma", avx512_tile, avx512, avx512_put, __m512, 12, 32, 16, 1,
        _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
        _mm512_fmadd_ps, _mm512_add_ps, _mm512_max_ps, _mm512_min_ps,
        avx512_load_first, avx512_store_first, [1 2 3 4 5 6 7 8 9 10 11]
    );

    /// The first `n` of 8 lanes (`n <= 8`), for `vmaskmovps`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn avx2_mask(n: usize) -> __m256i {
        let n = i32::try_from(n).unwrap_or(8);
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// The first `n` values at `p` (`n <= 8`), zeros after them.
    ///
    /// # Safety
    /// `n` values are readable from `p`; nothing past them is touched.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in crate::arch) unsafe fn avx2_load_first(p: *const f32, n: usize) -> __m256 {
        // SAFETY: the caller's contract; masked lanes do not fault.
        unsafe {
            if n >= 8 {
                _mm256_loadu_ps(p)
            } else {
                _mm256_maskload_ps(p, avx2_mask(n))
            }
        }
    }

    /// Stores the first `n` lanes of `v` at `p` (`n <= 8`).
    ///
    /// # Safety
    /// `n` values are writable from `p`; nothing past them is touched.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(in crate::arch) unsafe fn avx2_store_first(p: *mut f32, n: usize, v: __m256) {
        // SAFETY: the caller's contract; masked lanes do not fault.
        unsafe {
            if n >= 8 {
                _mm256_storeu_ps(p, v);
            } else {
                _mm256_maskstore_ps(p, avx2_mask(n), v);
            }
        }
    }

    /// The first `n` of 16 lanes (`n <= 16`).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    fn avx512_mask(n: usize) -> __mmask16 {
        u16::try_from((1u32 << n.min(16)) - 1).unwrap_or(u16::MAX)
    }

    /// The first `n` values at `p` (`n <= 16`), zeros after them.
    ///
    /// # Safety
    /// `n` values are readable from `p`; nothing past them is touched.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    pub(in crate::arch) unsafe fn avx512_load_first(p: *const f32, n: usize) -> __m512 {
        // SAFETY: the caller's contract; masked lanes do not fault.
        unsafe { _mm512_maskz_loadu_ps(avx512_mask(n), p) }
    }

    /// Stores the first `n` lanes of `v` at `p` (`n <= 16`).
    ///
    /// # Safety
    /// `n` values are writable from `p`; nothing past them is touched.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    pub(in crate::arch) unsafe fn avx512_store_first(p: *mut f32, n: usize, v: __m512) {
        // SAFETY: the caller's contract; masked lanes do not fault.
        unsafe { _mm512_mask_storeu_ps(p, avx512_mask(n), v) }
    }
}

/// The portable kernel over rows given as slices (no `unsafe`): what the compiler
/// vectorizes for the baseline target, and the reference of the tests.
fn portable<const NR: usize>(
    a: &IndirectRows<'_>,
    b: &PanelRun<'_>,
    c: &mut MatMut<'_>,
    (i0, j0): (usize, usize),
    accumulate: bool,
    post: Option<&Post<'_>>,
) {
    let (rows, taps, kc) = (a.rows, a.taps, a.kc);
    for q in 0..b.count {
        let panel = b.data.get(q * b.stride..).unwrap_or_default();
        let cols = if q + 1 == b.count { b.cols } else { NR };
        let mut acc = [[0f32; NR]; MAX_MR];
        for t in 0..taps {
            let bt = panel.get(t * kc * NR..).unwrap_or_default();
            for (i, row) in acc.iter_mut().enumerate().take(rows) {
                let x = a.row(t, i);
                for (p, bp) in bt.chunks_exact(NR).take(kc).enumerate() {
                    let xv = x.get(p).copied().unwrap_or(0.0);
                    for (s, &y) in row.iter_mut().zip(bp) {
                        *s += xv * y;
                    }
                }
            }
        }
        for (i, row) in acc.iter().enumerate().take(rows) {
            let Some(out) = c.row_run(i0 + i, j0 + q * NR, cols) else {
                continue;
            };
            for (j, (o, &s)) in out.iter_mut().zip(row).enumerate() {
                let mut x = if accumulate { *o + s } else { s };
                if let Some(p) = post {
                    if let TileBias::Cols(v) = p.bias {
                        x += v.get(q * NR + j).copied().unwrap_or(0.0);
                    }
                    x = crate::elementwise::clamp(x, p.min, p.max);
                }
                *o = x;
            }
        }
    }
}

/// Consecutive packed panels of the right operand that one call multiplies: `count`
/// panels `stride` values apart from the start of `data`, every one `nr` columns wide
/// but the last, of which only `cols` columns are stored.
#[derive(Clone, Copy)]
pub(crate) struct PanelRun<'a> {
    pub data: &'a [f32],
    pub stride: usize,
    pub count: usize,
    pub cols: usize,
}

impl<'a> PanelRun<'a> {
    /// Columns the run stores.
    fn width(&self, nr: usize) -> Option<usize> {
        self.count
            .checked_sub(1)?
            .checked_mul(nr)?
            .checked_add(self.cols)
    }
}

/// Where the rows of one tile of an indirect product are.
#[derive(Clone, Copy)]
enum Source<'a, T> {
    /// Row `i` of tap `t` is `list[t · rows + i]`, from value `skip` on.
    List { list: &'a [&'a [T]], skip: usize },
    /// Row `i` of tap `t` starts at `a[t · tap + i · row]`: a stem convolution's
    /// pixels in one output row, a fixed distance apart in its padded input.
    Strided { a: &'a [T], row: usize, tap: usize },
    /// Row `i` of tap `t` starts at `a[pixels[i] + taps[t]]`: a grouped convolution's
    /// pixels (across output rows) in its padded input, each tap a fixed offset.
    Table {
        a: &'a [T],
        pixels: &'a [usize],
        taps: &'a [usize],
    },
}

/// The rows of one tile of an indirect product, checked once: `taps · rows` rows of
/// at least `kc` values (f32, or the bytes of 8-bit products).
#[derive(Clone, Copy)]
pub(crate) struct IndirectRows<'a, T = f32> {
    source: Source<'a, T>,
    rows: usize,
    taps: usize,
    kc: usize,
}

impl<'a, T> IndirectRows<'a, T> {
    /// Rows given as slices, row `i` of tap `t` at `a[t · rows + i]`; checks the lengths.
    pub(crate) fn new(a: &'a [&'a [T]], rows: usize, taps: usize, kc: usize) -> Result<Self> {
        let n = taps.saturating_mul(rows);
        match a.get(..n) {
            Some(a)
                if taps <= MAX_ROW_TAPS && rows <= MAX_MR && a.iter().all(|r| r.len() >= kc) =>
            {
                Ok(Self {
                    source: Source::List { list: a, skip: 0 },
                    rows,
                    taps,
                    kc,
                })
            }
            _ => Err(Self::invalid(rows, taps, kc, a.len())),
        }
    }

    /// Rows at fixed distances in `a`: row `i` of tap `t` starts at `t · tap + i ·
    /// row`; checks that the last one ends inside `a`. Any number of rows: a strip
    /// that the float kernel takes tile by tile.
    pub(crate) fn strided(
        a: &'a [T],
        rows: usize,
        taps: usize,
        kc: usize,
        (row, tap): (usize, usize),
    ) -> Result<Self> {
        let end = (|| {
            rows.checked_sub(1)?
                .checked_mul(row)?
                .checked_add(taps.checked_sub(1)?.checked_mul(tap)?)?
                .checked_add(kc)
        })();
        match end {
            Some(end) if end <= a.len() && taps <= MAX_ROW_TAPS => Ok(Self {
                source: Source::Strided { a, row, tap },
                rows,
                taps,
                kc,
            }),
            _ => Err(Self::invalid(rows, taps, kc, a.len())),
        }
    }

    /// Rows at offsets in `a`: row `i` of tap `t` starts at `pixels[i] + taps[t]` (one
    /// row per pixel, one tap per offset); checks that every row ends inside `a`. Any
    /// number of rows, as [`Self::strided`].
    pub(crate) fn table(
        a: &'a [T],
        pixels: &'a [usize],
        taps: &'a [usize],
        kc: usize,
    ) -> Result<Self> {
        let end = (|| {
            pixels
                .iter()
                .max()?
                .checked_add(*taps.iter().max()?)?
                .checked_add(kc)
        })();
        match end {
            Some(end) if end <= a.len() && taps.len() <= MAX_ROW_TAPS => Ok(Self {
                source: Source::Table { a, pixels, taps },
                rows: pixels.len(),
                taps: taps.len(),
                kc,
            }),
            _ => Err(Self::invalid(pixels.len(), taps.len(), kc, a.len())),
        }
    }

    fn invalid(rows: usize, taps: usize, kc: usize, given: usize) -> Error {
        Error::InvalidParameter {
            what: format!("indirect rows: {taps} taps x {rows} rows of depth {kc}, {given} given"),
        }
    }

    /// The values of each row the product reads.
    pub(crate) fn depth(&self) -> usize {
        self.kc
    }

    /// Values `from..from + kc` of every row (within the checked ones): the rows of a
    /// block of groups, listed once, read group by group.
    pub(crate) fn columns(&self, from: usize, kc: usize) -> Result<Self> {
        if from.checked_add(kc).is_none_or(|end| end > self.kc) {
            return Err(Error::InvalidParameter {
                what: format!(
                    "indirect rows: values {from}..{from}+{kc} of rows of depth {}",
                    self.kc
                ),
            });
        }
        let source = match self.source {
            Source::List { list, skip } => Source::List {
                list,
                skip: skip + from,
            },
            Source::Strided { a, row, tap } => Source::Strided {
                a: a.get(from..).unwrap_or_default(),
                row,
                tap,
            },
            Source::Table { a, pixels, taps } => Source::Table {
                a: a.get(from..).unwrap_or_default(),
                pixels,
                taps,
            },
        };
        Ok(Self {
            source,
            kc,
            ..*self
        })
    }

    /// Rows `r0..r0 + n` of a strip (clamped to its rows); a list is never split.
    fn rows_from(&self, r0: usize, n: usize) -> Self {
        let source = match self.source {
            Source::List { list, skip } => Source::List { list, skip },
            Source::Strided { a, row, tap } => Source::Strided {
                a: a.get(r0 * row..).unwrap_or_default(),
                row,
                tap,
            },
            Source::Table { a, pixels, taps } => Source::Table {
                a,
                pixels: pixels.get(r0..).unwrap_or_default(),
                taps,
            },
        };
        Self {
            source,
            rows: n.min(self.rows.saturating_sub(r0)),
            ..*self
        }
    }

    /// Row `i` of tap `t` (empty past the checked ones).
    pub(crate) fn row(&self, t: usize, i: usize) -> &'a [T] {
        match self.source {
            Source::List { list, skip } => list.get(t * self.rows + i).and_then(|r| r.get(skip..)),
            Source::Strided { a, row, tap } => a.get(t * tap + i * row..),
            Source::Table { a, pixels, taps } => taps
                .get(t)
                .zip(pixels.get(i))
                .and_then(|(&o, &p)| a.get(o + p..)),
        }
        .unwrap_or_default()
    }
}

impl<T: Copy + 'static> IndirectRows<'_, T> {
    /// Rows per tap, taps, and the values read from each row.
    pub(crate) fn shape(&self) -> (usize, usize, usize) {
        (self.rows, self.taps, self.kc)
    }

    /// The rows as the x86 kernels read them.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn ptrs(&self) -> Ptrs<T> {
        match self.source {
            Source::List { list, skip } => Ptrs::List(ListPtrs(list.as_ptr().cast(), skip)),
            Source::Strided { a, row, tap } => Ptrs::Strided(StridedPtrs {
                a: a.as_ptr(),
                row,
                tap,
            }),
            Source::Table { a, pixels, taps } => Ptrs::Table(TablePtrs {
                a: a.as_ptr(),
                pixels: pixels.as_ptr(),
                taps: taps.as_ptr(),
            }),
        }
    }
}

/// [`IndirectRows`] as raw pointers, of any source.
#[cfg(target_arch = "x86_64")]
pub(crate) enum Ptrs<T: 'static> {
    List(ListPtrs<T>),
    Strided(StridedPtrs<T>),
    Table(TablePtrs<T>),
}

/// A checked [`IndirectRows`] as the x86 kernels read it.
#[cfg(target_arch = "x86_64")]
pub(crate) trait RowPtrs<T>: Copy {
    /// The start of row `i` of tap `t`, of a tile of `rows` rows.
    ///
    /// # Safety
    /// `t` and `i` are below the checked taps and rows; `rows` is the checked rows.
    unsafe fn row(self, t: usize, i: usize, rows: usize) -> *const T;
}

/// [`Source::List`]'s slices and the values skipped at the start of each.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct ListPtrs<T: 'static>(*const &'static [T], usize);

#[cfg(target_arch = "x86_64")]
impl<T: Copy> RowPtrs<T> for ListPtrs<T> {
    #[inline(always)]
    unsafe fn row(self, t: usize, i: usize, rows: usize) -> *const T {
        // SAFETY: the list holds `taps · rows` slices (the caller's contract), each
        // longer than the values skipped (checked by `IndirectRows`).
        unsafe { (*self.0.add(t * rows + i)).as_ptr().add(self.1) }
    }
}

/// [`Source::Strided`]'s start and distances.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct StridedPtrs<T> {
    a: *const T,
    row: usize,
    tap: usize,
}

#[cfg(target_arch = "x86_64")]
impl<T: Copy> RowPtrs<T> for StridedPtrs<T> {
    #[inline(always)]
    unsafe fn row(self, t: usize, i: usize, _rows: usize) -> *const T {
        // SAFETY: checked by `IndirectRows::strided` for every such row.
        unsafe { self.a.add(t * self.tap + i * self.row) }
    }
}

/// [`Source::Table`]'s start, pixel and tap offsets.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct TablePtrs<T> {
    a: *const T,
    pixels: *const usize,
    taps: *const usize,
}

#[cfg(target_arch = "x86_64")]
impl<T: Copy> RowPtrs<T> for TablePtrs<T> {
    #[inline(always)]
    unsafe fn row(self, t: usize, i: usize, _rows: usize) -> *const T {
        // SAFETY: t and i are below the table's taps and pixels, and every such row
        // was checked by `IndirectRows::table`.
        unsafe { self.a.add(*self.taps.add(t) + *self.pixels.add(i)) }
    }
}

/// One tile of an indirect product: `C[i][j] (+)= Σ_t Σ_k a[t·rows + i][k] · b[(t·kc +
/// k)·nr + j]` for the `rows × nr` tile of `c` at `(i, j)` (`+=` when `accumulate`),
/// then the post (column bias and clamp) if given, for each panel of `b` in turn (the
/// tiles side by side along the columns). Every length is checked first: `a` holds
/// `taps · rows` rows of at least `kc` values, each panel `taps · kc · nr` values, the
/// tiles lie inside `c` with contiguous columns, a column bias covers their columns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn indirect_microkernel(
    isa: Isa,
    rows_in: &IndirectRows<'_>,
    b: &PanelRun<'_>,
    c: &mut MatMut<'_>,
    (i, j): (usize, usize),
    accumulate: bool,
    post: Option<&Post<'_>>,
) -> Result {
    let IndirectRows {
        source,
        rows,
        taps,
        kc,
    } = *rows_in;
    let (mr, nr) = isa.gemm_tile();
    let width = b.width(nr).filter(|_| b.cols >= 1 && b.cols <= nr);
    let panel_len = taps.checked_mul(kc).and_then(|v| v.checked_mul(nr));
    let b_len = b
        .count
        .checked_sub(1)
        .and_then(|q| q.checked_mul(b.stride))
        .zip(panel_len)
        .and_then(|(start, len)| start.checked_add(len));
    // A list gives one tile's rows; strided and table sources may give a strip of
    // any length, taken tile by tile below after one check of the whole strip (the
    // checks cost as much as a short tile's multiplications).
    let strip = !matches!(source, Source::List { .. });
    let ok = rows >= 1
        && (strip || rows <= mr)
        && b_len.is_some_and(|l| b.data.len() >= l)
        && post.is_none_or(|p| match p.bias {
            TileBias::Cols(v) => width.is_some_and(|w| v.len() >= w),
            TileBias::None => true,
            TileBias::Rows(_) => false,
        });
    let tile = width.and_then(|w| c.tile_ptr(i, j, rows, w));
    let Some((cp, rs)) = tile.filter(|_| ok && isa.is_available()) else {
        return Err(Error::InvalidParameter {
            what: format!(
                "indirect micro-kernel call: {rows} rows (mr {mr}), {taps} taps of depth {kc}, {} panels of b {}",
                b.count,
                b.data.len()
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
            /// # Safety
            /// `a` gives the rows of `rows_in`, checked by its constructor; every
            /// other length is checked above; the instruction set is available.
            #[allow(clippy::too_many_arguments)]
            unsafe fn call<A: RowPtrs<f32>>(
                isa: Isa,
                (rows, taps, kc): (usize, usize, usize),
                a: A,
                panels: (*const f32, usize, usize, usize),
                (cp, rs): (*mut f32, usize),
                accumulate: bool,
                raw: RawPost,
            ) {
                // SAFETY: forwarded contract.
                unsafe {
                    if isa == Isa::Avx512 {
                        x86::avx512(rows, taps, kc, a, panels, cp, rs, accumulate, raw);
                    } else {
                        x86::avx2(rows, taps, kc, a, panels, cp, rs, accumulate, raw);
                    }
                }
            }
            let panels = (b.data.as_ptr(), b.stride, b.count, b.cols);
            // SAFETY: the rows as checked by `IndirectRows`, the rest above; tile `r0`
            // of a strip is its rows `r0..r0 + n` (checked with the strip) and the
            // output rows as many below `cp` (inside the checked tile).
            unsafe {
                match source {
                    Source::List { list, skip } => {
                        let a = ListPtrs(list.as_ptr().cast(), skip);
                        call(isa, (rows, taps, kc), a, panels, (cp, rs), accumulate, raw);
                    }
                    Source::Strided { a, row, tap } => {
                        for (r0, n) in even_tiles(rows, mr, mr) {
                            let a = StridedPtrs {
                                a: a.as_ptr().add(r0 * row),
                                row,
                                tap,
                            };
                            let shape = (n, taps, kc);
                            let c = (cp.add(r0 * rs), rs);
                            call(isa, shape, a, panels, c, accumulate, raw);
                        }
                    }
                    Source::Table {
                        a,
                        pixels,
                        taps: offsets,
                    } => {
                        for (r0, n) in even_tiles(rows, mr, mr) {
                            let a = TablePtrs {
                                a: a.as_ptr(),
                                pixels: pixels.as_ptr().add(r0),
                                taps: offsets.as_ptr(),
                            };
                            let shape = (n, taps, kc);
                            let c = (cp.add(r0 * rs), rs);
                            call(isa, shape, a, panels, c, accumulate, raw);
                        }
                    }
                }
            }
        }
        _ => {
            for r0 in (0..rows).step_by(mr) {
                let tile = rows_in.rows_from(r0, mr);
                let at = (i + r0, j);
                match nr {
                    8 => portable::<8>(&tile, b, c, at, accumulate, post),
                    32 => portable::<32>(&tile, b, c, at, accumulate, post),
                    _ => portable::<16>(&tile, b, c, at, accumulate, post),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_matches_a_direct_sum_over_runs_of_panels() {
        for isa in Isa::available() {
            let (mr, nr) = isa.gemm_tile();
            let (taps, kc) = (3, 7);
            let stride = taps * kc * nr + 5; // panels need not be adjacent
            let src: Vec<f32> = (0..200).map(|v| (v % 13) as f32 * 0.25 - 1.0).collect();
            let rows_data: Vec<&[f32]> = (0..taps * mr).map(|r| &src[(r * 5) % 150..]).collect();
            let b: Vec<f32> = (0..3 * stride).map(|v| (v % 7) as f32 - 3.0).collect();
            let bias: Vec<f32> = (0..3 * nr).map(|v| v as f32).collect();
            for (rows, count, cols) in (1..=mr)
                .flat_map(|r| (1..=3).map(move |n| (r, n)))
                .flat_map(|(r, n)| [1, nr / 2, nr / 2 + 1, nr].map(|c| (r, n, c)))
            {
                let a: Vec<&[f32]> = (0..taps)
                    .flat_map(|t| (0..rows).map(move |i| (t, i)))
                    .map(|(t, i)| rows_data[t * mr + i])
                    .collect();
                let width = (count - 1) * nr + cols;
                let run = PanelRun {
                    data: &b,
                    stride,
                    count,
                    cols,
                };
                // Two columns past the run that no call may touch.
                let ldc = width + 2;
                for (accumulate, with_post) in [(false, true), (true, true), (true, false)] {
                    let post = Post {
                        bias: TileBias::Cols(&bias[..width]),
                        min: -40.0,
                        max: 40.0,
                    };
                    let mut got = vec![1.0f32; rows * ldc];
                    let mut gv = MatMut::row_major(&mut got, rows, ldc).unwrap();
                    let r = IndirectRows::new(&a, rows, taps, kc).unwrap();
                    let post = with_post.then_some(&post);
                    indirect_microkernel(isa, &r, &run, &mut gv, (0, 0), accumulate, post).unwrap();
                    for i in 0..rows {
                        for j in 0..ldc {
                            let (q, s) = (j / nr, j % nr);
                            let want = if j >= width {
                                1.0
                            } else {
                                let mut sum: f64 = if accumulate { 1.0 } else { 0.0 };
                                for t in 0..taps {
                                    for p in 0..kc {
                                        let x = a[t * rows + i][p] as f64;
                                        sum += x * b[q * stride + (t * kc + p) * nr + s] as f64;
                                    }
                                }
                                if with_post {
                                    sum = (sum + bias[j] as f64).clamp(-40.0, 40.0);
                                }
                                sum as f32
                            };
                            let x = got[i * ldc + j];
                            assert!(
                                (x - want).abs() <= 1e-4 * want.abs().max(1.0),
                                "{isa:?} rows {rows} panels {count} cols {cols} at ({i}, {j}): {x} vs {want}"
                            );
                        }
                    }
                }
            }
            let mut c = vec![0.0; 2 * nr];
            let mut v = MatMut::row_major(&mut c, 1, 2 * nr).unwrap();
            assert!(IndirectRows::new(&[&src[..4]], 1, 1, 8).is_err());
            assert!(IndirectRows::new(&[&src[..4]], 2, 1, 1).is_err());
            let one = [&src[..4]];
            let r = IndirectRows::new(&one, 1, 1, 4).unwrap();
            // A view of some of each row's values stays inside the checked ones.
            assert_eq!(r.columns(1, 3).unwrap().row(0, 0), &src[1..4]);
            assert_eq!(
                r.columns(1, 2).unwrap().columns(1, 1).unwrap().row(0, 0),
                &src[2..4]
            );
            assert!(r.columns(1, 4).is_err() && r.columns(usize::MAX, 2).is_err());
            let short = PanelRun {
                data: &b[..3],
                stride: 0,
                count: 1,
                cols: nr,
            };
            assert!(indirect_microkernel(isa, &r, &short, &mut v, (0, 0), false, None).is_err());
            // A run wider than the output, or than its bias, or a second panel past `b`.
            let wide = PanelRun {
                data: &b,
                stride: 4 * nr,
                count: 3,
                cols: 1,
            };
            assert!(indirect_microkernel(isa, &r, &wide, &mut v, (0, 0), false, None).is_err());
            let two = PanelRun { count: 2, ..wide };
            let narrow = Post {
                bias: TileBias::Cols(&bias[..nr]),
                min: 0.0,
                max: 1.0,
            };
            let post = Some(&narrow);
            assert!(indirect_microkernel(isa, &r, &two, &mut v, (0, 0), false, post).is_err());
            let far = PanelRun {
                stride: b.len(),
                ..two
            };
            assert!(indirect_microkernel(isa, &r, &far, &mut v, (0, 0), false, None).is_err());
            let empty = PanelRun { cols: 0, ..two };
            assert!(indirect_microkernel(isa, &r, &empty, &mut v, (0, 0), false, None).is_err());
            assert!(indirect_microkernel(isa, &r, &two, &mut v, (0, 0), false, None).is_ok());
        }
    }

    #[test]
    fn strided_and_table_rows_are_the_rows_they_name() {
        let src: Vec<f32> = (0..400).map(|v| (v % 11) as f32 * 0.5 - 2.0).collect();
        for isa in Isa::available() {
            let (mr, nr) = isa.gemm_tile();
            let (kc, row, tap) = (9, 6, 120);
            let b: Vec<f32> = (0..3 * kc * 2 * nr).map(|v| (v % 5) as f32 - 2.0).collect();
            for (rows, taps) in (1..=mr).flat_map(|r| (1..=3).map(move |t| (r, t))) {
                let run = PanelRun {
                    data: &b,
                    stride: taps * kc * nr,
                    count: 2,
                    cols: nr - 3,
                };
                let s = src.as_slice();
                let list: Vec<&[f32]> = (0..taps)
                    .flat_map(|t| (0..rows).map(move |i| &s[3 + t * tap + i * row..]))
                    .collect();
                let mut outs = [(); 3].map(|_| vec![0f32; rows * 2 * nr]);
                let offsets: Vec<usize> = (0..taps).map(|t| t * tap).collect();
                let pixels: Vec<usize> = (0..rows).map(|i| i * row).collect();
                let sources = [
                    IndirectRows::new(&list, rows, taps, kc).unwrap(),
                    IndirectRows::strided(&src[3..], rows, taps, kc, (row, tap)).unwrap(),
                    IndirectRows::table(&src[3..], &pixels, &offsets, kc).unwrap(),
                ];
                for (out, a) in outs.iter_mut().zip(&sources) {
                    let mut c = MatMut::row_major(out, rows, 2 * nr).unwrap();
                    indirect_microkernel(isa, a, &run, &mut c, (0, 0), false, None).unwrap();
                }
                assert_eq!(outs[0], outs[1], "{isa:?} rows {rows} taps {taps}");
                assert_eq!(outs[0], outs[2], "{isa:?} rows {rows} taps {taps}, table");
                assert!(outs[0].iter().any(|&v| v != 0.0));
            }
            // The last row of the last tap must end inside the slice.
            let end = 11 * row + 2 * tap + kc;
            assert!(IndirectRows::strided(&src[..end], 12, 3, kc, (row, tap)).is_ok());
            assert!(IndirectRows::strided(&src[..end - 1], 12, 3, kc, (row, tap)).is_err());
            assert!(IndirectRows::strided(&src, 0, 1, kc, (row, tap)).is_err());
            assert!(IndirectRows::strided(&src, 1, 0, kc, (row, tap)).is_err());
            assert!(IndirectRows::strided(&src, 2, 1, 1, (usize::MAX, 0)).is_err());
            // A table's farthest pixel and tap bound its rows, in any order.
            let offsets = [2 * tap, 0, tap];
            let pixels: Vec<usize> = (0..12).rev().map(|i| i * row).collect();
            assert!(IndirectRows::table(&src[..end], &pixels, &offsets, kc).is_ok());
            assert!(IndirectRows::table(&src[..end - 1], &pixels, &offsets, kc).is_err());
            assert!(IndirectRows::table(&src, &[0], &[], kc).is_err());
            assert!(IndirectRows::table(&src, &[], &[0], kc).is_err());
            assert!(IndirectRows::table(&src, &[0, 1], &[usize::MAX], 1).is_err());
        }
    }

    #[test]
    fn tiles_cover_the_rows_and_spread_only_a_short_last_tile() {
        let tiles = |rows, mr, fewest| even_tiles(rows, mr, fewest).collect::<Vec<_>>();
        assert_eq!(
            tiles(49, 12, 12),
            [(0, 10), (10, 10), (20, 10), (30, 10), (40, 9)]
        );
        assert_eq!(tiles(28, 12, 4), [(0, 12), (12, 12), (24, 4)]);
        assert_eq!(tiles(14, 12, 4), [(0, 7), (7, 7)]);
        assert_eq!(tiles(24, 12, 4), [(0, 12), (12, 12)]);
        assert!(tiles(0, 12, 4).is_empty());
        for rows in 1..60 {
            for (mr, fewest) in [(12, 12), (12, 4), (6, 1), (1, 1)] {
                let t = tiles(rows, mr, fewest);
                assert_eq!(t.len(), rows.div_ceil(mr));
                let mut next = 0;
                for &(first, n) in &t {
                    assert!(first == next && (1..=mr).contains(&n), "{rows} {mr} {t:?}");
                    next += n;
                }
                assert_eq!(next, rows);
            }
        }
    }

    #[test]
    fn strips_are_their_tiles_one_after_another() {
        let src: Vec<f32> = (0..3000).map(|v| (v % 13) as f32 * 0.25 - 1.5).collect();
        for isa in Isa::available() {
            let (mr, nr) = isa.gemm_tile();
            let (kc, row, tap, taps) = (5, 7, 300, 2);
            let b: Vec<f32> = (0..2 * taps * kc * nr)
                .map(|v| (v % 7) as f32 - 3.0)
                .collect();
            let bias: Vec<f32> = (0..2 * nr).map(|v| v as f32 * 0.5).collect();
            let run = PanelRun {
                data: &b,
                stride: taps * kc * nr,
                count: 2,
                cols: nr - 1,
            };
            let post = Post {
                bias: TileBias::Cols(&bias),
                min: -30.0,
                max: 30.0,
            };
            let offsets: Vec<usize> = (0..taps).map(|t| t * tap).collect();
            for rows in [mr + 1, 2 * mr, 2 * mr + 5, 3 * mr + 1] {
                let pixels: Vec<usize> = (0..rows).map(|i| i * row).collect();
                let s = src.as_slice();
                let mut want = vec![1f32; rows * 2 * nr];
                let mut c = MatMut::row_major(&mut want, rows, 2 * nr).unwrap();
                for r0 in (0..rows).step_by(mr) {
                    let n = mr.min(rows - r0);
                    let list: Vec<&[f32]> = (0..taps)
                        .flat_map(|t| (r0..r0 + n).map(move |i| &s[t * tap + i * row..]))
                        .collect();
                    let a = IndirectRows::new(&list, n, taps, kc).unwrap();
                    indirect_microkernel(isa, &a, &run, &mut c, (r0, 0), true, Some(&post))
                        .unwrap();
                }
                let strips = [
                    IndirectRows::strided(s, rows, taps, kc, (row, tap)).unwrap(),
                    IndirectRows::table(s, &pixels, &offsets, kc).unwrap(),
                ];
                for a in &strips {
                    let mut got = vec![1f32; rows * 2 * nr];
                    let mut c = MatMut::row_major(&mut got, rows, 2 * nr).unwrap();
                    indirect_microkernel(isa, a, &run, &mut c, (0, 0), true, Some(&post)).unwrap();
                    assert_eq!(got, want, "{isa:?} strip of {rows} rows");
                    // The whole strip must fit the output.
                    let mut short = vec![0f32; (rows - 1) * 2 * nr];
                    let mut c = MatMut::row_major(&mut short, rows - 1, 2 * nr).unwrap();
                    assert!(
                        indirect_microkernel(isa, a, &run, &mut c, (0, 0), false, None).is_err()
                    );
                }
                // A list holds one tile.
                let list: Vec<&[f32]> = vec![s; taps * rows];
                let mut c = MatMut::row_major(&mut want, rows, 2 * nr).unwrap();
                let call = IndirectRows::new(&list, rows, taps, kc)
                    .and_then(|a| indirect_microkernel(isa, &a, &run, &mut c, (0, 0), false, None));
                assert!(call.is_err());
            }
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
