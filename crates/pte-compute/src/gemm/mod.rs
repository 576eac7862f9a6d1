//! f32 matrix products: `C (+)= A · B`, then bias and activation, on packed panels.
//!
//! The loop nest is BLIS's: for each block of `nc` columns and `kc` depths, B is packed
//! (or read pre-packed) in panels of `nr` columns; for each block of `mc` rows, A is
//! packed (or read pre-packed) in panels of `mr` rows, or, when its rows are contiguous
//! along the depth, read in place through row pointers by the indirect micro-kernel of
//! the NHWC convolutions (no packing pass); a micro-kernel then computes each `mr × nr`
//! tile in registers. With packed A, the B panel of `kc × nr` stays in L1 while the A
//! block streams from L2; with A in place, one call computes a row tile across a run
//! of B panels (up to [`L2_PANEL_BYTES`], held in L2), the row tile staying in L1.
//! After the last depth block the micro-kernel stores the tile through the bias and
//! clamp of the epilogue; any other activation then runs over the rows of the block
//! while they are still in cache. Edge tiles run a micro-kernel of exactly the
//! remaining rows; edge columns go through a small tile buffer (packed A) or are
//! stored by the indirect kernel itself.
//!
//! Operands packed once ([`PackedA`], [`PackedB`]: constant weights, at load time)
//! keep their panels over the whole depth, so any depth block is a contiguous run of
//! them. Packing scratch comes from the caller ([`Gemm::scratch_len`]); nothing is
//! allocated per call.
//!
//! Threads split the larger of m and n (counted in tiles) into one range per thread
//! (finer ranges were measured slower: each streams all of B again); each thread runs
//! the loop nest on its range with its own packing scratch. A product with one row and
//! a strided B skips packing (a vector-matrix product).

mod batched;
mod pack;

pub use batched::{BatchMut, BatchRef};

pub(crate) use pack::Lines;

use crate::arch::{self, multiversion, Isa, Post, TileBias};
use crate::elementwise::{self, Activation};
use crate::error::{self, Error, Result};
use crate::mat::{MatMut, MatRef, MAX_PARTS};
use crate::pool::ThreadPool;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Depth of a block (the k extent of packed panels held in cache).
const KC: usize = 256;

/// Bytes from which a constant weight stored `[n, k]` (a linear layer's) is best read
/// where it lies, as [`Rhs::Mat`], rather than packed: one larger than a last-level
/// cache comes from memory at every execution whatever its layout, so a packed copy
/// only costs load time and memory (alexnet's three classifier layers, 234 MB, took
/// about 0.2 s to pack and doubled its resident memory).
pub const IN_PLACE_WEIGHT_BYTES: usize = 32 << 20;

/// Rows of a product up to which weights in packed panels are swept whole-depth (see
/// `block_loop`).
const GEMV_ROWS: usize = 4;
/// Multiply-adds below which a product runs on one thread.
const PARALLEL_WORK: usize = 1 << 17;
/// Packed elements from which packing is split between threads (256 KiB).
const PARALLEL_PACK: usize = 1 << 16;
/// Bytes of B packed per slab by [`SlabsB`]: a temporary of this size stays in the
/// second-level cache, and a mapped weight gives back its pages this many at a time.
const SLAB_BYTES: usize = 1 << 20;
/// Alignment (in f32) of packed buffers: a cache line.
const ALIGN: usize = 16;

/// A bias added in the epilogue.
#[derive(Clone, Copy, Debug, Default)]
pub enum Bias<'a> {
    /// No bias.
    #[default]
    None,
    /// One value per row of C (an output channel of an NCHW convolution).
    Row(&'a [f32]),
    /// One value per column of C (an output feature of a linear layer).
    Col(&'a [f32]),
}

/// What happens to the product before it is stored:
/// `C = act(A·B + bias)` or, with `accumulate`, `C = act(C + A·B + bias)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// Add to C instead of overwriting it (BLAS beta = 1; beta = 0 otherwise: C is not
    /// read, NaN in it does not leak).
    pub accumulate: bool,
    /// A bias per row or per column.
    pub bias: Bias<'a>,
    /// An activation applied last.
    pub activation: Activation,
}

impl<'a> Epilogue<'a> {
    /// The epilogue of the block of C from row `i0` and column `j0` on: its bias
    /// starts there.
    fn at(&self, i0: usize, j0: usize) -> Epilogue<'a> {
        let bias = match self.bias {
            Bias::Row(v) => Bias::Row(v.get(i0..).unwrap_or(&[])),
            Bias::Col(v) => Bias::Col(v.get(j0..).unwrap_or(&[])),
            Bias::None => Bias::None,
        };
        Epilogue { bias, ..*self }
    }
}

/// Panels of `w` lines over the whole depth (see [`pack`]), 64-byte aligned, in memory
/// shared with other weights (`pte_alloc::Zeroed::try_shared`).
#[derive(Debug)]
pub(crate) struct Panels {
    isa: Isa,
    lines: usize,
    depth: usize,
    w: usize,
    buf: pte_alloc::Zeroed<f32>,
}

impl Panels {
    /// Packs `src`, split between the threads of `pool` when it is large: packing
    /// writes fresh memory, and the page faults of a large weight scale with threads.
    fn new(isa: Isa, src: &MatRef<'_>, w: usize, pool: Option<&ThreadPool>) -> Result<Self> {
        let mut packed = Self::zeroed(isa, src.rows(), src.cols(), w)?;
        packed.fill(0, src, pool)?;
        Ok(packed)
    }

    /// Packs the lines of `src` as lines `at..` of these panels (`at` a multiple of
    /// the panel width; `src` as deep as the panels).
    fn fill(&mut self, at: usize, src: &MatRef<'_>, pool: Option<&ThreadPool>) -> Result {
        let (lines, depth, w, isa) = (src.rows(), self.depth, self.w, self.isa);
        let panel = depth * w;
        let fits = w > 0
            && at.is_multiple_of(w)
            && src.cols() == depth
            && at.checked_add(lines).is_some_and(|end| end <= self.lines);
        // Within the buffer: `zeroed` sized it for `self.lines` lines.
        let dst = fits
            .then(|| {
                self.buf
                    .get_mut(at / w * panel..(at + lines).div_ceil(w) * panel)
            })
            .flatten()
            .ok_or_else(|| Error::ShapeMismatch {
                what: format!(
                    "{lines} lines of depth {} packed from line {at} into {} of depth {depth}",
                    src.cols(),
                    self.lines
                ),
            })?;
        // No depth: nothing to pack.
        let Some(panels) = dst.len().checked_div(panel) else {
            return Ok(());
        };
        let pack_panels = |first: usize, dst: &mut [f32]| {
            let l0 = first * w;
            let count = (dst.len() / panel * w).min(lines.saturating_sub(l0));
            src.pack(isa, l0, count, 0, depth, w, dst);
        };
        match pool.filter(|p| p.threads() > 1 && dst.len() >= PARALLEL_PACK) {
            Some(pool) => {
                let per_task = panels.div_ceil(pool.threads() * 4).max(1);
                pool.parallel_groups(dst, panel, per_task, &mut [0u8; 0], 0, |first, group, _| {
                    pack_panels(first, group)
                })?;
            }
            None => pack_panels(0, dst),
        }
        Ok(())
    }

    /// Zeroed panels of `w` lines for `lines × depth`, for a caller that writes them.
    fn zeroed(isa: Isa, lines: usize, depth: usize, w: usize) -> Result<Self> {
        let len = pack::packed_len(lines, depth, w).ok_or(Error::SizeOverflow {
            what: "packed operand",
        })?;
        let buf = pte_alloc::Zeroed::try_shared(len).ok_or(Error::OutOfMemory {
            what: "packed operand",
            len,
        })?;
        Ok(Self {
            isa,
            lines,
            depth,
            w,
            buf,
        })
    }

    fn data(&self) -> &[f32] {
        &self.buf
    }

    /// Multiplies line `l` by `scale[l]` (in f64, rounded once: the same values as
    /// scaling before packing). Padding lines stay zero.
    fn scale_lines(&mut self, scale: &[f64]) -> Result {
        if scale.len() != self.lines {
            return Err(Error::ShapeMismatch {
                what: format!("{} factors for {} packed lines", scale.len(), self.lines),
            });
        }
        let (depth, w) = (self.depth, self.w);
        if depth == 0 || w == 0 {
            return Ok(());
        }
        for (panel, factors) in self.buf.chunks_exact_mut(depth * w).zip(scale.chunks(w)) {
            scale_runs(self.isa, panel, factors, w);
        }
        Ok(())
    }

    /// Panels holding lines `l0..` (`l0` a multiple of `w`) from depth `k0`, and the
    /// distance between panels.
    pub(crate) fn block(&self, l0: usize, k0: usize) -> (&[f32], usize) {
        let stride = self.depth * self.w;
        (
            self.data()
                .get(l0 / self.w * stride + k0 * self.w..)
                .unwrap_or(&[]),
            stride,
        )
    }

    fn check(&self, isa: Isa) -> Result {
        if self.isa != isa {
            return Err(Error::PackingMismatch {
                packed: self.isa.name(),
                used: isa.name(),
            });
        }
        Ok(())
    }
}

/// A left operand (m × k) packed once in the micro-kernel's row panels, e.g. the weights
/// of an NCHW convolution.
#[derive(Debug)]
pub struct PackedA(Panels);

multiversion! {
    /// Each run of `w` values of `panel` times `factors`, value by value (in f64,
    /// rounded once), vectorized for the CPU: regnet_x_400mf's folded batch
    /// normalizations took 1.0 ms of its load in the baseline build, 0.7 so.
    fn scale_runs<const FMA: bool>(panel: &mut [f32], factors: &[f64], w: usize) {
        for run in panel.chunks_exact_mut(w.max(1)) {
            for (v, &s) in run.iter_mut().zip(factors) {
                *v = (f64::from(*v) * s) as f32;
            }
        }
    }
}

/// A right operand (k × n) packed once in the micro-kernel's column panels, e.g. the
/// weights of a linear layer.
#[derive(Debug)]
pub struct PackedB(Panels);

impl PackedA {
    pub(crate) fn panels(&self) -> &Panels {
        &self.0
    }
    /// Heap bytes held (for memory budgets).
    pub fn bytes(&self) -> usize {
        self.0.buf.len() * std::mem::size_of::<f32>()
    }
    /// Multiplies row `i` by `scale[i]` (in f64, rounded once), e.g. to fold a
    /// per-channel factor into weights already packed.
    pub fn scale_rows(&mut self, scale: &[f64]) -> Result {
        self.0.scale_lines(scale)
    }
    /// Rows (m).
    pub fn rows(&self) -> usize {
        self.0.lines
    }
    /// Columns (k).
    pub fn cols(&self) -> usize {
        self.0.depth
    }
}

impl PackedB {
    pub(crate) fn panels(&self) -> &Panels {
        &self.0
    }
    /// Heap bytes held (for memory budgets).
    pub fn bytes(&self) -> usize {
        self.0.buf.len() * std::mem::size_of::<f32>()
    }
    /// Multiplies column `j` by `scale[j]` (in f64, rounded once), e.g. to fold a
    /// per-channel factor into weights already packed.
    pub fn scale_columns(&mut self, scale: &[f64]) -> Result {
        self.0.scale_lines(scale)
    }
    /// The panels, for a caller that fills them itself: one run of `k × w` values per
    /// `w` columns, in which B's element (r, c) sits at `r * w + c % w` of run `c / w`
    /// (columns past n stay zero); and `w`.
    pub(crate) fn panels_mut(&mut self) -> (std::slice::ChunksExactMut<'_, f32>, usize) {
        let (depth, w) = (self.0.depth, self.0.w);
        (self.0.buf.chunks_exact_mut((depth * w).max(1)), w)
    }
    /// Rows (k).
    pub fn rows(&self) -> usize {
        self.0.depth
    }
    /// Columns (n).
    pub fn cols(&self) -> usize {
        self.0.lines
    }
}

/// A right operand being packed a slab of columns at a time, in order, for a caller
/// that rearranges its weights slab by slab (a convolution's, through a temporary
/// of one slab instead of one of the whole weight) or gives back their memory as it
/// goes (see [`Gemm::pack_bt_on`]).
pub struct SlabsB<'p> {
    panels: Panels,
    pool: &'p ThreadPool,
    /// The first column not packed yet.
    next: usize,
    /// Columns per slab: whole panels.
    per: usize,
}

impl SlabsB<'_> {
    /// The columns of B the next slab holds; `None` once every column is packed.
    pub fn next_columns(&self) -> Option<Range<usize>> {
        let n = self.panels.lines;
        (self.next < n).then(|| self.next..n.min(self.next.saturating_add(self.per)))
    }

    /// Packs the next slab: `bt` holds its columns of B as rows (columns × k).
    pub fn pack(&mut self, bt: MatRef<'_>) -> Result {
        let cols = self.next_columns().unwrap_or_default();
        if bt.rows() != cols.len() {
            return Err(Error::ShapeMismatch {
                what: format!("a slab of {} columns for columns {cols:?}", bt.rows()),
            });
        }
        self.panels.fill(cols.start, &bt, Some(self.pool))?;
        self.next = cols.end;
        Ok(())
    }

    /// The packed operand, once every slab is packed.
    pub fn finish(self) -> Result<PackedB> {
        match self.next_columns() {
            None => Ok(PackedB(self.panels)),
            Some(cols) => Err(Error::ShapeMismatch {
                what: format!("columns {cols:?} of a packed operand never packed"),
            }),
        }
    }
}

/// The left operand of a product.
#[derive(Clone, Copy, Debug)]
pub enum Lhs<'a> {
    /// A strided matrix, packed during the call.
    Mat(MatRef<'a>),
    /// Packed at load time.
    Packed(&'a PackedA),
}

/// The right operand of a product.
#[derive(Clone, Copy, Debug)]
pub enum Rhs<'a> {
    /// A strided matrix, packed during the call.
    Mat(MatRef<'a>),
    /// Packed at load time.
    Packed(&'a PackedB),
}

/// One side of the driver: packed once, or packed block by block from lines.
#[derive(Clone, Copy)]
pub(crate) enum Side<'a, L: Lines> {
    Packed(&'a Panels),
    Lines(&'a L),
}

impl<L: Lines> Side<'_, L> {
    fn lines(&self) -> usize {
        match self {
            Side::Packed(p) => p.lines,
            Side::Lines(l) => l.lines(),
        }
    }

    fn depth(&self) -> usize {
        match self {
            Side::Packed(p) => p.depth,
            Side::Lines(l) => l.depth(),
        }
    }

    /// Panels of lines `l0..l0 + len` over depths `k0..k0 + kc`, and the panel stride.
    #[allow(clippy::too_many_arguments)]
    fn block<'s>(
        &'s self,
        isa: Isa,
        l0: usize,
        len: usize,
        k0: usize,
        kc: usize,
        w: usize,
        scratch: &'s mut [f32],
    ) -> (&'s [f32], usize) {
        match self {
            Side::Packed(p) => p.block(l0, k0),
            Side::Lines(l) => {
                l.pack(isa, l0, len, k0, kc, w, scratch);
                (scratch, kc * w)
            }
        }
    }
}

/// A matrix-product engine bound to one instruction set's micro-kernel and block sizes.
/// Create it once ([`Gemm::new`] picks the best instruction set of this CPU) and use it
/// to pack constant operands at load time and to run products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    isa: Isa,
    mr: usize,
    nr: usize,
    mc: usize,
    nc: usize,
}

impl Default for Gemm {
    fn default() -> Self {
        Self::new()
    }
}

impl Gemm {
    /// The engine for the best instruction set of this CPU.
    pub fn new() -> Self {
        Self::for_isa(Isa::best())
    }

    /// The engine for `isa`, or [`Error::IsaUnavailable`].
    pub fn with_isa(isa: Isa) -> Result<Self> {
        Ok(Self::for_isa(isa.check()?))
    }

    fn for_isa(isa: Isa) -> Self {
        let (mr, nr) = isa.gemm_tile();
        // The A block (mc × KC) fills about half of a 512 KiB L2 at most; the B block
        // (KC × nc) is streamed from L3 once per row block.
        let mc = (MAX_MC / mr).max(1) * mr;
        let nc = (2048 / nr).max(1) * nr;
        Self {
            isa,
            mr,
            nr,
            mc,
            nc,
        }
    }

    /// The instruction set.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Packs a left operand once (for constant weights).
    pub fn pack_a(&self, a: MatRef<'_>) -> Result<PackedA> {
        Panels::new(self.isa, &a, self.mr, None).map(PackedA)
    }

    /// Packs a right operand once (for constant weights).
    pub fn pack_b(&self, b: MatRef<'_>) -> Result<PackedB> {
        Panels::new(self.isa, &b.t(), self.nr, None).map(PackedB)
    }

    /// [`Self::pack_a`] on the threads of `pool`.
    pub fn pack_a_on(&self, pool: &ThreadPool, a: MatRef<'_>) -> Result<PackedA> {
        Panels::new(self.isa, &a, self.mr, Some(pool)).map(PackedA)
    }

    /// [`Self::pack_b`] on the threads of `pool`.
    pub fn pack_b_on(&self, pool: &ThreadPool, b: MatRef<'_>) -> Result<PackedB> {
        Panels::new(self.isa, &b.t(), self.nr, Some(pool)).map(PackedB)
    }

    /// Packs B (`k × n`) from `bt`, its transpose stored row-major (each column of B
    /// one run of `k` values, as a linear layer's `[n, k]` weight is stored), a slab of
    /// columns at a time (see [`SlabsB`]), and hands each slab's values of `bt` to
    /// `consumed` once they are packed: a caller whose weight lies in a mapped file
    /// gives those pages back as it goes, so that no part of a large weight is resident
    /// twice (in the file's pages and packed) for longer than its slab.
    pub fn pack_bt_on(
        &self,
        pool: &ThreadPool,
        bt: &[f32],
        n: usize,
        k: usize,
        consumed: &mut dyn FnMut(&[f32]),
    ) -> Result<PackedB> {
        let mut slabs = self.slabs_b(pool, k, n)?;
        while let Some(cols) = slabs.next_columns() {
            let part = error::mul(cols.start, k, "slab")
                .ok()
                .zip(error::mul(cols.end, k, "slab").ok())
                .and_then(|(a, b)| bt.get(a..b))
                .ok_or_else(|| Error::ShapeMismatch {
                    what: format!("{} values for a {n} × {k} transposed operand", bt.len()),
                })?;
            slabs.pack(MatRef::row_major(part, cols.len(), k)?)?;
            consumed(part);
        }
        slabs.finish()
    }

    /// An empty `k × n` right operand to be packed a slab of columns at a time, in
    /// order, on the threads of `pool` (see [`SlabsB`]).
    pub fn slabs_b<'p>(&self, pool: &'p ThreadPool, k: usize, n: usize) -> Result<SlabsB<'p>> {
        let panels = Panels::zeroed(self.isa, n, k, self.nr)?;
        // Whole panels, about SLAB_BYTES of B each, at least one panel.
        let w = self.nr.max(1);
        let per = (SLAB_BYTES / 4 / k.max(1) / w).max(1).saturating_mul(w);
        Ok(SlabsB {
            panels,
            pool,
            next: 0,
            per,
        })
    }

    /// A zeroed `k × n` right operand in this product's panels, for a caller that
    /// computes the values into place (see [`PackedB::panels_mut`]).
    pub(crate) fn zeroed_b(&self, k: usize, n: usize) -> Result<PackedB> {
        Panels::zeroed(self.isa, n, k, self.nr).map(PackedB)
    }

    /// Scratch (in f32 elements) that [`Gemm::run`] needs for an `m × n × k` product on
    /// `threads` threads, with the left and right operands packed beforehand or not.
    pub fn scratch_len(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a_packed: bool,
        b_packed: bool,
        threads: usize,
    ) -> Result<usize> {
        let plan = self.plan(m, n, k, threads, (a_packed, b_packed));
        let per_thread = self.per_thread_scratch(&plan, a_packed, b_packed)?;
        error::mul(
            per_thread,
            plan.scratch_parts(threads),
            "matrix product scratch",
        )
    }

    /// `C = act(A·B + bias)` (or `C = act(C + A·B + bias)`, see [`Epilogue`]) on the
    /// pool's threads, `scratch` at least [`Gemm::scratch_len`] long.
    pub fn run(
        &self,
        pool: &ThreadPool,
        c: MatMut<'_>,
        a: Lhs<'_>,
        b: Rhs<'_>,
        epilogue: &Epilogue<'_>,
        scratch: &mut [f32],
    ) -> Result {
        match (a, b) {
            (Lhs::Mat(a), Rhs::Mat(b))
                if a.rows() == 1
                    && c.rows() == 1
                    && a.cols() == b.rows()
                    && b.cols() == c.cols()
                    && (b.col_stride() == 1 || b.row_stride() == 1) =>
            {
                self.vector_matrix(pool, c, a, VectorRhs::Mat(b), epilogue)
            }
            (Lhs::Mat(a), Rhs::Mat(b)) => self.run_sides(
                pool,
                c,
                Side::Lines(&a),
                Side::Lines(&b.t()),
                epilogue,
                scratch,
            ),
            (Lhs::Mat(a), Rhs::Packed(b))
                if a.rows() == 1
                    && c.rows() == 1
                    && a.cols() == b.0.depth
                    && c.cols() == b.0.lines
                    && a.row_run(0, 0, a.cols()).is_some() =>
            {
                b.0.check(self.isa)?;
                self.vector_matrix(pool, c, a, VectorRhs::Panels(&b.0), epilogue)
            }
            (Lhs::Mat(a), Rhs::Packed(b)) => {
                b.0.check(self.isa)?;
                self.run_sides(
                    pool,
                    c,
                    Side::Lines(&a),
                    Side::<MatRef<'_>>::Packed(&b.0),
                    epilogue,
                    scratch,
                )
            }
            (Lhs::Packed(a), Rhs::Mat(b)) => {
                a.0.check(self.isa)?;
                self.run_sides(
                    pool,
                    c,
                    Side::<MatRef<'_>>::Packed(&a.0),
                    Side::Lines(&b.t()),
                    epilogue,
                    scratch,
                )
            }
            (Lhs::Packed(a), Rhs::Packed(b)) => {
                a.0.check(self.isa)?;
                b.0.check(self.isa)?;
                self.run_sides(
                    pool,
                    c,
                    Side::<MatRef<'_>>::Packed(&a.0),
                    Side::<MatRef<'_>>::Packed(&b.0),
                    epilogue,
                    scratch,
                )
            }
        }
    }

    /// Scratch (in f32 elements) that [`Gemm::run_on_caller`] needs for an `m × n × k`
    /// product.
    pub(crate) fn caller_scratch_len(&self, m: usize, n: usize, k: usize) -> Result<usize> {
        self.scratch_len(m, n, k, false, true, 1)
    }

    /// `C = act(A·B + bias)` on the calling thread alone, B packed at load time: for
    /// callers that already split their work over the pool (one product per task).
    pub(crate) fn run_on_caller(
        &self,
        mut c: MatMut<'_>,
        a: MatRef<'_>,
        b: &PackedB,
        epilogue: &Epilogue<'_>,
        scratch: &mut [f32],
    ) -> Result {
        b.0.check(self.isa)?;
        let (a, b) = (Side::Lines(&a), Side::<MatRef<'_>>::Packed(&b.0));
        if !self.prologue(&mut c, &a, &b, epilogue)? {
            return Ok(());
        }
        let (m, n, k) = (a.lines(), b.lines(), a.depth());
        let needed = self.caller_scratch_len(m, n, k)?;
        let len = scratch.len();
        let scratch = scratch
            .get_mut(..needed)
            .ok_or(Error::ScratchTooSmall { len, needed })?;
        self.block_loop(c, 0, 0, &a, &b, epilogue, scratch)
    }

    /// The product with the right operand given as lines (columns of B) of any kind:
    /// used by the convolutions with their implicit im2col matrix.
    pub(crate) fn run_sides<A: Lines, B: Lines>(
        &self,
        pool: &ThreadPool,
        mut c: MatMut<'_>,
        a: Side<'_, A>,
        b: Side<'_, B>,
        epilogue: &Epilogue<'_>,
        scratch: &mut [f32],
    ) -> Result {
        if !self.prologue(&mut c, &a, &b, epilogue)? {
            return Ok(());
        }
        let (m, n, k) = (a.lines(), b.lines(), a.depth());
        let packed = (matches!(a, Side::Packed(_)), matches!(b, Side::Packed(_)));
        let plan = self.plan(m, n, k, pool.threads(), packed);
        let per_thread = self.per_thread_scratch(&plan, packed.0, packed.1)?;
        let parts = plan.scratch_parts(pool.threads());
        let needed = error::mul(per_thread, parts, "matrix product scratch")?;
        let len = scratch.len();
        let scratch = scratch
            .get_mut(..needed)
            .ok_or(Error::ScratchTooSmall { len, needed })?;
        if plan.tasks == 1 {
            return self.block_loop(c, 0, 0, &a, &b, epilogue, scratch);
        }
        self.split(pool, &plan, per_thread, c, &a, &b, epilogue, scratch)
    }

    /// Checks shapes and bias lengths; Ok(false) when there is nothing to multiply
    /// (C empty, or k = 0 and the epilogue already applied).
    fn prologue<A: Lines, B: Lines>(
        &self,
        c: &mut MatMut<'_>,
        a: &Side<'_, A>,
        b: &Side<'_, B>,
        epilogue: &Epilogue<'_>,
    ) -> Result<bool> {
        let (m, n, k) = (a.lines(), b.lines(), a.depth());
        if b.depth() != k || c.rows() != m || c.cols() != n {
            return Err(Error::ShapeMismatch {
                what: format!(
                    "cannot multiply {m}x{k} by {}x{n} into {}x{}",
                    b.depth(),
                    c.rows(),
                    c.cols()
                ),
            });
        }
        match epilogue.bias {
            Bias::Row(v) => error::need("row bias", v.len(), m)?,
            Bias::Col(v) => error::need("column bias", v.len(), n)?,
            Bias::None => {}
        }
        if m == 0 || n == 0 {
            return Ok(false);
        }
        if k == 0 {
            // No product: C = act(beta·C + bias).
            self.epilogue_rows(
                c,
                0,
                0,
                m,
                n,
                epilogue.bias,
                epilogue.activation,
                !epilogue.accumulate,
            );
            return Ok(false);
        }
        Ok(true)
    }

    /// Runs the loop nest on one thread per part of C.
    #[allow(clippy::too_many_arguments)]
    fn split<A: Lines, B: Lines>(
        &self,
        pool: &ThreadPool,
        plan: &Plan,
        per_thread: usize,
        c: MatMut<'_>,
        a: &Side<'_, A>,
        b: &Side<'_, B>,
        epilogue: &Epilogue<'_>,
        scratch: &mut [f32],
    ) -> Result {
        let parts = c.into_parts(plan.split_n, plan.step);
        let failed = crate::pool::FirstError::default();
        pool.parallel_for_scratch(plan.tasks, scratch, per_thread, |t, s| {
            if let Some(view) = parts.take(t) {
                let at = t * plan.step;
                let (i0, j0) = if plan.split_n { (0, at) } else { (at, 0) };
                let epi = epilogue.at(i0, j0);
                failed.keep(self.block_loop(view, i0, j0, a, b, &epi, s));
            }
        })?;
        failed.into_result()
    }

    /// `c (1 × n) = a (1 × k) · b`: a sum of scaled rows of B when its rows are
    /// contiguous or it is packed, else one dot product per column; columns split over
    /// the pool's threads when B is large enough to pay for the hand-off and recent
    /// splits paid ([`ThreadPool::split_pays`]). (The tile kernel would compute a whole
    /// tile of rows for the one row of C.)
    fn vector_matrix(
        &self,
        pool: &ThreadPool,
        c: MatMut<'_>,
        a: MatRef<'_>,
        b: VectorRhs<'_>,
        epi: &Epilogue<'_>,
    ) -> Result {
        let (k, n) = b.dims();
        match epi.bias {
            Bias::Row(v) => error::need("row bias", v.len(), 1)?,
            Bias::Col(v) => error::need("column bias", v.len(), n)?,
            Bias::None => {}
        }
        let threads = pool.threads();
        if threads < 2
            || k.saturating_mul(n) < VECTOR_SPLIT_VALUES
            || n < 2 * VECTOR_COLUMNS
            || !pool.split_pays()
        {
            return self.vector_columns(c, a, b, 0, epi);
        }
        let started = Instant::now();
        // Nanoseconds the caller's own range took (task 0 is the caller's first).
        let own = AtomicU64::new(0);
        let tasks = threads.min(MAX_PARTS).min(n / VECTOR_COLUMNS);
        // Parts start at a panel's first column.
        let unit = match b {
            VectorRhs::Panels(p) => VECTOR_COLUMNS.max(p.w),
            VectorRhs::Mat(_) => VECTOR_COLUMNS,
        };
        let step = n.div_ceil(tasks.max(1)).next_multiple_of(unit);
        let parts = c.into_parts(true, step);
        let failed = crate::pool::FirstError::default();
        pool.parallel_for(n.div_ceil(step), |t, thread| {
            let mine = (t == 0 && thread == 0).then(Instant::now);
            if let Some(part) = parts.take(t) {
                let j0 = t * step;
                failed.keep(self.vector_columns(part, a, b, j0, &epi.at(0, j0)));
            }
            if let Some(from) = mine {
                own.store(from.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        });
        pool.record_split(
            Duration::from_nanos(own.load(Ordering::Relaxed)),
            started.elapsed(),
        );
        failed.into_result()
    }

    /// [`Self::vector_matrix`] into `c`, whose column 0 is column `j0` of B.
    fn vector_columns(
        &self,
        mut c: MatMut<'_>,
        a: MatRef<'_>,
        b: VectorRhs<'_>,
        j0: usize,
        epi: &Epilogue<'_>,
    ) -> Result {
        const BLOCK: usize = 512;
        let (k, n) = (b.dims().0, c.cols());
        let row = || {
            a.row_run(0, 0, k).ok_or_else(|| Error::ShapeMismatch {
                what: "a vector-matrix product's row is not contiguous".into(),
            })
        };
        let mut j = 0;
        while j < n {
            let w = BLOCK.min(n - j);
            // Packed panels store their sums straight into a contiguous row of C (the
            // usual case), then the epilogue runs over it.
            if let (VectorRhs::Panels(p), false) = (b, epi.accumulate) {
                if let Some(run) = c.row_run(0, j, w) {
                    panel_columns(self.isa, row()?, p, j0 + j, run);
                    self.epilogue_rows(&mut c, 0, j, 1, w, epi.bias, epi.activation, false);
                    j += w;
                    continue;
                }
            }
            // Otherwise blocks of columns are summed on the stack, then stored.
            let mut acc = [0f32; BLOCK];
            let acc = acc.get_mut(..w).unwrap_or_default();
            match b {
                VectorRhs::Panels(p) => panel_columns(self.isa, row()?, p, j0 + j, acc),
                VectorRhs::Mat(b) if b.col_stride() == 1 => {
                    for p in 0..k {
                        if let Some(run) = b.row_run(p, j0 + j, w) {
                            axpy(self.isa, acc, a.at(0, p), run);
                        }
                    }
                }
                VectorRhs::Mat(b) => {
                    let x: Option<&[f32]> = a.row_run(0, 0, k);
                    let col = |s: usize| b.t().row_run(j0 + j + s, 0, k);
                    let one = |s: usize| match (x, col(s)) {
                        (Some(x), Some(col)) => dot(self.isa, x, col),
                        _ => (0..k).map(|p| a.at(0, p) * b.at(p, j0 + j + s)).sum(),
                    };
                    // DOT_ROWS columns at a time: as many streams of B from memory, each
                    // value of `a` loaded once for them.
                    for (q, v) in acc.chunks_mut(DOT_ROWS).enumerate() {
                        let s = DOT_ROWS * q;
                        let cols: [Option<&[f32]>; DOT_ROWS] = std::array::from_fn(|i| col(s + i));
                        match x {
                            Some(x) if v.len() == DOT_ROWS && cols.iter().all(Option::is_some) => {
                                let cols = cols.map(Option::unwrap_or_default);
                                v.copy_from_slice(&dot_rows(self.isa, x, cols));
                            }
                            _ => v.iter_mut().enumerate().for_each(|(i, v)| *v = one(s + i)),
                        }
                    }
                }
            }
            match c.row_run(0, j, w) {
                // A contiguous row (the usual case): whole slices.
                Some(run) if epi.accumulate => run.iter_mut().zip(&*acc).for_each(|(c, a)| *c += a),
                Some(run) => run.copy_from_slice(acc),
                None => {
                    for (s, &v) in acc.iter().enumerate() {
                        let old = if epi.accumulate {
                            c.get(0, j + s).unwrap_or(0.0)
                        } else {
                            0.0
                        };
                        c.set(0, j + s, old + v);
                    }
                }
            }
            self.epilogue_rows(&mut c, 0, j, 1, w, epi.bias, epi.activation, false);
            j += w;
        }
        Ok(())
    }

    /// How an `m × n × k` product splits over `threads`, given which operands
    /// (`(a, b)`) come packed beforehand.
    ///
    /// Each thread packs the parts of an operand given unpacked that its share of C
    /// reads; splitting along the other operand would make every thread pack all of
    /// it. So the split goes along the operand given unpacked when the other one is
    /// packed and it has tiles enough to balance (two per thread); otherwise along the
    /// longer side.
    fn plan(&self, m: usize, n: usize, k: usize, threads: usize, packed: (bool, bool)) -> Plan {
        let work = m.saturating_mul(n).saturating_mul(k);
        let (m_tiles, n_tiles) = (m.div_ceil(self.mr), n.div_ceil(self.nr));
        let enough = |tiles: usize| tiles >= 2 * threads;
        let split_n = match packed {
            (true, false) if enough(n_tiles) => true,
            // Packed weights that outgrow L2, or a few row tiles that the threads would
            // share unevenly, with fewer rows than columns: each thread streams its own
            // columns of the weights and reads all rows. Split by rows, every thread
            // read all the weights, and 49 rows went to two threads as 36 and 13
            // (convnext_tiny's last stage, 49 × 3072 × 768: 143 -> 212 GFLOP/s at 2
            // threads; its third, 196 rows and 2.4 MB of weights, 201 -> 221).
            // Transformers' 64 to 197 tokens split evenly by rows stay so (by columns,
            // 7-15% slower).
            (false, true)
                if enough(n_tiles)
                    && m < n
                    && (k.saturating_mul(n).saturating_mul(4) > 8 * L2_PANEL_BYTES
                        || (m_tiles % threads != 0 && m_tiles < 4 * threads)) =>
            {
                true
            }
            (false, true) if enough(m_tiles) => false,
            _ => n_tiles >= m_tiles,
        };
        let tiles = if split_n { n_tiles } else { m_tiles };
        let threads = threads
            .min(MAX_PARTS)
            .min(tiles)
            .min((work / PARALLEL_WORK).max(1))
            .max(1);
        let w = if split_n { self.nr } else { self.mr };
        let step = tiles.div_ceil(threads) * w;
        let tasks = if split_n { n } else { m }.div_ceil(step.max(1)).max(1);
        let (rows, cols) = if split_n {
            (m, step.min(n))
        } else {
            (step.min(m), n)
        };
        Plan {
            tasks,
            split_n,
            step,
            rows,
            cols,
            k,
        }
    }

    fn per_thread_scratch(&self, plan: &Plan, a_packed: bool, b_packed: bool) -> Result<usize> {
        let kc = KC.min(plan.k.max(1));
        let a = if a_packed {
            Some(0)
        } else {
            pack::packed_len(self.mc.min(plan.rows), kc, self.mr)
        };
        let b = if b_packed {
            Some(0)
        } else {
            pack::packed_len(self.nc.min(plan.cols), kc, self.nr)
        };
        let total = a
            .zip(b)
            .and_then(|(a, b)| a.checked_add(b)?.checked_add(2 * ALIGN))
            .ok_or(Error::SizeOverflow {
                what: "matrix product scratch",
            })?;
        // Keep each thread's part a whole number of cache lines.
        Ok(total.div_ceil(ALIGN) * ALIGN)
    }

    /// The loop nest over one thread's part of C, whose (0, 0) is (i0, j0) of the whole.
    #[allow(clippy::too_many_arguments)]
    fn block_loop<A: Lines, B: Lines>(
        &self,
        mut c: MatMut<'_>,
        i0: usize,
        j0: usize,
        a: &Side<'_, A>,
        b: &Side<'_, B>,
        epi: &Epilogue<'_>,
        scratch: &mut [f32],
    ) -> Result {
        let (m, n, k) = (c.rows(), c.cols(), a.depth());
        let (mr, nr) = (self.mr, self.nr);
        let kc_max = KC.min(k);
        let a_len = if matches!(a, Side::Packed(_)) {
            0
        } else {
            pack::packed_len(self.mc.min(m), kc_max, mr).unwrap_or(0)
        };
        // Clamps are fused into the micro-kernel; other activations run after it.
        let ((min, max), extra) = match epi.activation {
            Activation::Clamp { min, max } => ((min, max), Activation::Identity),
            a => ((f32::NEG_INFINITY, f32::INFINITY), a),
        };
        let scratch = aligned(scratch);
        let (a_buf, b_buf) = scratch.split_at_mut(a_len.min(scratch.len()));
        let b_buf = aligned(b_buf);
        // Rows of A contiguous along the depth are read in place by the indirect
        // micro-kernel instead of being packed (the packing cost up to 15% of a product
        // with n = 192); that kernel adds column biases only.
        let in_place_rows = !matches!(epi.bias, Bias::Row(_));
        let mut rows_buf: [&[f32]; MAX_MC] = [&[]; MAX_MC];
        // A product of a few rows, all read in place, by packed weights (a classifier
        // on a batch of one) takes each panel's whole depth at once: the weights then
        // stream from memory in one sweep, where blocks of depth jumped from panel to
        // panel (`bench product 1 1280 960 1 packed-b` 39.6 -> 46 GFLOP/s; in
        // mobilenet_v3_large's classifier 0.285 and 0.271 -> 0.262 and 0.248 ms).
        let sweep = m <= GEMV_ROWS
            && in_place_rows
            && c.col_stride() == 1
            && matches!(b, Side::Packed(_))
            && match a {
                Side::Lines(l) => (0..m).all(|r| l.run_in_place(i0 + r, 0, k).is_some()),
                _ => false,
            };
        let kc = if sweep { k.max(1) } else { KC };
        for jc in (0..n).step_by(self.nc) {
            let nb = self.nc.min(n - jc);
            for pc in (0..k).step_by(kc) {
                let kb = kc.min(k - pc);
                let (bp, b_stride) = b.block(self.isa, j0 + jc, nb, pc, kb, nr, b_buf);
                let last = pc + kb == k;
                let accumulate = pc > 0 || epi.accumulate;
                for ic in (0..m).step_by(self.mc) {
                    let mb = self.mc.min(m - ic);
                    let in_place = c.col_stride() == 1
                        && match a {
                            Side::Lines(l) if in_place_rows && mb <= MAX_MC => {
                                rows_buf.iter_mut().take(mb).enumerate().all(|(r, slot)| {
                                    l.run_in_place(i0 + ic + r, pc, kb)
                                        .map(|run| *slot = run)
                                        .is_some()
                                })
                            }
                            _ => false,
                        };
                    let block = Block {
                        at: (ic, jc),
                        size: (mb, nb, kb),
                        accumulate,
                        post: last.then_some((epi.bias, (min, max), extra)),
                    };
                    if in_place {
                        let rows = rows_buf.get(..mb).unwrap_or_default();
                        self.in_place_block(&mut c, rows, (bp, b_stride), &block)?;
                    } else {
                        let ap = a.block(self.isa, i0 + ic, mb, pc, kb, mr, a_buf);
                        self.packed_block(&mut c, ap, (bp, b_stride), &block)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// One [`Block`] of C from rows of A read in place (`rows`, one slice per row of the
    /// block) and the packed B block `(panels, stride)`:
    /// each call of the indirect micro-kernel computes one row tile across a run of
    /// panels, so the call overhead is paid once per run rather than once per tile (it
    /// was a fifth of a vit_tiny product at depth 192). A run of panels stays in L2
    /// while the row tiles stream past. The block's `post`: the column bias (relative
    /// to C), the clamp, and an activation applied to each row tile's run right after
    /// it is stored, while it is in L1.
    fn in_place_block(
        &self,
        c: &mut MatMut<'_>,
        rows: &[&[f32]],
        (panels, stride): (&[f32], usize),
        block: &Block<'_>,
    ) -> Result {
        let Block {
            at: (ic, jc),
            size: (_, nb, kb),
            accumulate,
            post,
        } = *block;
        let (mr, nr) = (self.mr, self.nr);
        let count = nb.div_ceil(nr);
        let per_run = (L2_PANEL_BYTES / (kb * nr * 4).max(1)).max(1);
        for q0 in (0..count).step_by(per_run) {
            let run_count = per_run.min(count - q0);
            let j = jc + q0 * nr;
            let run = arch::PanelRun {
                data: panels.get(q0 * stride..).unwrap_or_default(),
                stride,
                count: run_count,
                cols: nr.min(nb - (q0 + run_count - 1) * nr),
            };
            let width = (run_count - 1) * nr + run.cols;
            let act = post.map_or(Activation::Identity, |p| p.2);
            let post = post.map(|(bias, (min, max), _)| Post {
                bias: match bias {
                    Bias::Col(v) => TileBias::Cols(v.get(j..).unwrap_or_default()),
                    Bias::Row(_) | Bias::None => TileBias::None,
                },
                min,
                max,
            });
            for (t, tile_rows) in rows.chunks(mr).enumerate() {
                let list = arch::IndirectRows::new(tile_rows, tile_rows.len(), 1, kb)?;
                let (i, n) = (ic + t * mr, tile_rows.len());
                arch::indirect_microkernel(
                    self.isa,
                    &list,
                    &run,
                    c,
                    (i, j),
                    accumulate,
                    post.as_ref(),
                )?;
                if act != Activation::Identity {
                    self.epilogue_rows(c, i, j, n, width, Bias::None, act, false);
                }
            }
        }
        Ok(())
    }

    /// One [`Block`] of C from packed A and B blocks (`(data, stride)` each), tile by tile:
    /// a B panel stays in L1 while the A panels stream from L2. `post` as for
    /// [`Self::in_place_block`], a row bias included; an activation other than a clamp
    /// runs over the rows of the finished block (a row of a tile is only nr long, and a
    /// call per tile cost a sixth of a SiLU).
    fn packed_block(
        &self,
        c: &mut MatMut<'_>,
        (ap, a_stride): (&[f32], usize),
        (bp, b_stride): (&[f32], usize),
        block: &Block<'_>,
    ) -> Result {
        let Block {
            at: (ic, jc),
            size: (mb, nb, kb),
            accumulate,
            post,
        } = *block;
        let (mr, nr) = (self.mr, self.nr);
        for jr in (0..nb).step_by(nr) {
            let bpanel = bp.get(jr / nr * b_stride..).unwrap_or(&[]);
            let cols = nr.min(nb - jr);
            for ir in (0..mb).step_by(mr) {
                let apanel = ap.get(ir / mr * a_stride..).unwrap_or(&[]);
                let rows = mr.min(mb - ir);
                let tile = |c: &mut MatMut<'_>, at, post| {
                    arch::microkernel(self.isa, rows, kb, apanel, bpanel, c, at, accumulate, post)
                };
                let (i, j) = (ic + ir, jc + jr);
                let mut padded = [0f32; MAX_NR];
                let post = post.map(|(bias, (min, max), _)| Post {
                    bias: match bias {
                        Bias::None => TileBias::None,
                        Bias::Row(v) => TileBias::Rows(v.get(i..).unwrap_or_default()),
                        Bias::Col(v) => {
                            let v = v.get(j..).unwrap_or_default();
                            if v.len() >= nr {
                                TileBias::Cols(v)
                            } else {
                                padded.iter_mut().zip(v).for_each(|(p, &b)| *p = b);
                                TileBias::Cols(&padded)
                            }
                        }
                    },
                    min,
                    max,
                });
                if cols == nr && (c.col_stride() == 1 || nr == 1) {
                    tile(c, (i, j), post.as_ref())?;
                } else {
                    self.edge_tile(c, (i, j), (rows, cols), accumulate, |t| {
                        tile(t, (0, 0), post.as_ref())
                    })?;
                }
            }
        }
        if let Some((_, _, act)) = post.filter(|p| p.2 != Activation::Identity) {
            self.epilogue_rows(c, ic, jc, mb, nb, Bias::None, act, false);
        }
        Ok(())
    }

    /// A tile with fewer than nr columns or strided columns, through a tile buffer:
    /// `kernel` computes the whole `rows × nr` tile at (0, 0) of the buffer.
    fn edge_tile(
        &self,
        c: &mut MatMut<'_>,
        (i, j): (usize, usize),
        (rows, cols): (usize, usize),
        accumulate: bool,
        kernel: impl FnOnce(&mut MatMut<'_>) -> Result,
    ) -> Result {
        let mut tile = [0f32; MAX_TILE];
        let nr = self.nr;
        let mut t = MatMut::row_major(&mut tile, rows, nr)?;
        if accumulate {
            for r in 0..rows {
                match (c.row_run(i + r, j, cols), t.row_run(r, 0, cols)) {
                    (Some(src), Some(dst)) => dst.copy_from_slice(src),
                    _ => (0..cols).for_each(|s| {
                        t.set(r, s, c.get(i + r, j + s).unwrap_or(0.0));
                    }),
                }
            }
        }
        kernel(&mut t)?;
        for r in 0..rows {
            match (c.row_run(i + r, j, cols), t.row_run(r, 0, cols)) {
                (Some(dst), Some(src)) => dst.copy_from_slice(src),
                _ => (0..cols).for_each(|s| {
                    c.set(i + r, j + s, t.get(r, s).unwrap_or(0.0));
                }),
            }
        }
        Ok(())
    }

    /// Applies `bias` and `act` to `rows × cols` of C at (i, j) (bias indices relative
    /// to this view); with `zero`, C is cleared first.
    #[allow(clippy::too_many_arguments)]
    fn epilogue_rows(
        &self,
        c: &mut MatMut<'_>,
        i: usize,
        j: usize,
        rows: usize,
        cols: usize,
        bias: Bias<'_>,
        act: Activation,
        zero: bool,
    ) {
        if !zero && act == Activation::Identity && matches!(bias, Bias::None) {
            return;
        }
        for r in i..i + rows {
            let row_bias = match bias {
                Bias::Row(v) => v.get(r).copied().unwrap_or(0.0),
                _ => 0.0,
            };
            let col_bias = match bias {
                Bias::Col(v) => v.get(j..j + cols),
                _ => None,
            };
            match c.row_run(r, j, cols) {
                Some(run) => {
                    if zero {
                        run.fill(0.0);
                    }
                    match col_bias {
                        Some(v) => {
                            // Lengths agree: both are `cols` long.
                            let _ = elementwise::add_vector_activate(self.isa, run, v, act);
                        }
                        None => elementwise::add_scalar_activate(self.isa, run, row_bias, act),
                    }
                }
                None => {
                    for s in j..j + cols {
                        let old = if zero {
                            0.0
                        } else {
                            c.get(r, s).unwrap_or(0.0)
                        };
                        let b = col_bias
                            .and_then(|v| v.get(s - j))
                            .copied()
                            .unwrap_or(row_bias);
                        c.set(r, s, act.apply_scalar(old + b));
                    }
                }
            }
        }
    }
}

/// Values of B from which a vector-matrix product splits its columns over threads,
/// one range per thread (below, the hand-off costs more than a thread saves). On the
/// 2-vCPU Zen 4 VM, with the workers held: 64 × 256 took 1.3 µs on one thread and
/// 1.4 on two, 128 × 256 2.2 and 1.9, 128 × 512 3.8 and 2.8. Four ranges per thread
/// were 1.3-3x slower up to 256 × 512: a thread that joins late has its ranges taken
/// by the other, whose L2 does not hold their columns.
const VECTOR_SPLIT_VALUES: usize = 1 << 15;
const VECTOR_COLUMNS: usize = 16;
const DOT_ROWS: usize = 8;

/// The right operand of a vector-matrix product.
#[derive(Clone, Copy)]
enum VectorRhs<'b> {
    Mat(MatRef<'b>),
    /// Packed in column panels (a constant weight).
    Panels(&'b Panels),
}

impl VectorRhs<'_> {
    /// (k, n).
    fn dims(&self) -> (usize, usize) {
        match self {
            VectorRhs::Mat(b) => (b.rows(), b.cols()),
            VectorRhs::Panels(p) => (p.depth, p.lines),
        }
    }
}

/// `out = x · B[.., j..j + out.len()]` for B in `panels`, `j` the first column of a
/// panel (the blocks and the threads' parts are multiples of the panel width), the
/// last panel's padding columns dropped.
fn panel_columns(isa: Isa, x: &[f32], panels: &Panels, j: usize, out: &mut [f32]) {
    let (k, w) = (x.len(), panels.w.max(1));
    let first = j / w;
    for (g, out) in out.chunks_mut(VECTOR_PANELS * w).enumerate() {
        let at = (first + g * VECTOR_PANELS) * k * w;
        let len = out.len().div_ceil(w) * k * w;
        let group = panels.buf.get(at..at + len).unwrap_or_default();
        panels_vector(isa, x, group, w, out);
    }
}

/// Panels of B that [`panels_vector`] runs through together.
const VECTOR_PANELS: usize = 4;

/// [`panel_vector`] for up to [`VECTOR_PANELS`] consecutive panels, `out` their
/// columns. A whole group runs its panels side by side: each value of `x` is loaded
/// once for four streams of B, and at 16 columns a panel (AVX2) the four hold eight
/// independent sums without a reduction at the end. Against one panel at a time on
/// the Zen 4 machine, one thread: one row by 128 × 512 (weights in L2) 20 → 22.5
/// GFLOP/s, by 128 × 64 (in L1) 15 → 20; a language model's decode step, whose 56 MB
/// of weights stream from memory, 7.3 → 5.5 ms (the four streams keep more of it in
/// flight).
fn panels_vector(isa: Isa, x: &[f32], panels: &[f32], w: usize, out: &mut [f32]) {
    if out.len() == VECTOR_PANELS * w && fixed_width_vector(isa, x, panels, w, true, out) {
        return;
    }
    let k = x.len();
    for (q, out) in out.chunks_mut(w).enumerate() {
        let panel = panels.get(q * k * w..(q + 1) * k * w).unwrap_or_default();
        panel_vector(isa, x, panel, w, out);
    }
}

/// [`panels_vector`] on a whole group of panels `W` wide.
#[inline(always)]
fn panel_group_vector_w<const FMA: bool, const W: usize>(
    x: &[f32],
    panels: &[f32],
    out: &mut [f32],
) {
    let k = x.len();
    let (p01, p23) = panels.split_at(panels.len().min(2 * k * W));
    let (p0, p1) = p01.split_at(p01.len().min(k * W));
    let (p2, p3) = p23.split_at(p23.len().min(k * W));
    let mut acc = [[0f32; W]; VECTOR_PANELS];
    let rows = (p0.chunks_exact(W).zip(p1.chunks_exact(W)))
        .zip(p2.chunks_exact(W).zip(p3.chunks_exact(W)));
    for (&xv, ((r0, r1), (r2, r3))) in x.iter().zip(rows) {
        for (a, r) in acc.iter_mut().zip([r0, r1, r2, r3]) {
            for (c, &b) in a.iter_mut().zip(r) {
                *c = arch::madd::<FMA>(xv, b, *c);
            }
        }
    }
    for (o, a) in out.chunks_exact_mut(W).zip(&acc) {
        o.copy_from_slice(a);
    }
}

/// `out[j] = Σₚ x[p] · panel[p·w + j]` for one packed panel of width `w` (`out` may
/// be shorter: the last panel's padding columns are not stored).
fn panel_vector(isa: Isa, x: &[f32], panel: &[f32], w: usize, out: &mut [f32]) {
    if out.len() != w || !fixed_width_vector(isa, x, panel, w, false, out) {
        panel_vector_any(isa, x, panel, w, out);
    }
}

/// [`panel_vector`] for a panel `W` wide, all of it stored: four sets of `W`
/// accumulators (registers, in the compiled loop), one per depth of a group of four,
/// so that no addition waits for the one before.
#[inline(always)]
fn panel_vector_w<const FMA: bool, const W: usize>(x: &[f32], panel: &[f32], out: &mut [f32]) {
    let mut acc = [[0f32; W]; 4];
    let (xs, rows) = (x.chunks_exact(4), panel.chunks_exact(4 * W));
    let (x_tail, row_tail) = (xs.remainder(), rows.remainder());
    for (x4, r4) in xs.zip(rows) {
        for (u, (acc, r)) in acc.iter_mut().zip(r4.chunks_exact(W)).enumerate() {
            let xv = x4.get(u).copied().unwrap_or(0.0);
            for (c, &b) in acc.iter_mut().zip(r) {
                *c = arch::madd::<FMA>(xv, b, *c);
            }
        }
    }
    for (&xv, r) in x_tail.iter().zip(row_tail.chunks_exact(W)) {
        for (c, &b) in acc[0].iter_mut().zip(r) {
            *c = arch::madd::<FMA>(xv, b, *c);
        }
    }
    let [a0, a1, a2, a3] = &acc;
    let pairs = a0.iter().zip(a1).zip(a2.iter().zip(a3));
    for (o, ((a, b), (c, d))) in out.iter_mut().zip(pairs) {
        *o = (a + b) + (c + d);
    }
}

multiversion! {
    /// The kernels compiled for fixed panel widths: [`panel_group_vector_w`] for a
    /// whole group (`grouped`) at the micro-kernels' widths (NEON's 8, AVX2's and the
    /// portable 16, AVX-512's 32), [`panel_vector_w`] for one whole panel 16 or 32
    /// wide. False for any other width.
    fn fixed_width_vector<const FMA: bool>(
        x: &[f32],
        panels: &[f32],
        w: usize,
        grouped: bool,
        out: &mut [f32],
    ) -> bool {
        match (grouped, w) {
            (true, 8) => panel_group_vector_w::<FMA, 8>(x, panels, out),
            (true, 16) => panel_group_vector_w::<FMA, 16>(x, panels, out),
            (true, 32) => panel_group_vector_w::<FMA, 32>(x, panels, out),
            (false, 16) => panel_vector_w::<FMA, 16>(x, panels, out),
            (false, 32) => panel_vector_w::<FMA, 32>(x, panels, out),
            _ => return false,
        }
        true
    }
}

multiversion! {
    fn panel_vector_any<const FMA: bool>(x: &[f32], panel: &[f32], w: usize, out: &mut [f32]) {
        out.fill(0.0);
        for (&xv, row) in x.iter().zip(panel.chunks_exact(w.max(1))) {
            for (o, &b) in out.iter_mut().zip(row) {
                *o = arch::madd::<FMA>(xv, b, *o);
            }
        }
    }
}

/// Bytes of packed B panels one run of the indirect micro-kernel covers (half a typical
/// L2), in products and in convolutions alike.
pub(crate) const L2_PANEL_BYTES: usize = 256 * 1024;
/// Rows of A in a block (`mc`, rounded down to a multiple of mr): the in-place rows of
/// a block are listed in an array of this length.
const MAX_MC: usize = 120;
/// Largest mr × nr of any micro-kernel.
const MAX_TILE: usize = 12 * 32;
/// Largest nr of any micro-kernel.
const MAX_NR: usize = 32;

/// One block of C for [`Gemm::in_place_block`] and [`Gemm::packed_block`]: its
/// position, `(rows, columns, depth)`, whether it adds to C, and on the last depth
/// block the bias, the clamp and any other activation.
#[derive(Clone, Copy)]
struct Block<'a> {
    at: (usize, usize),
    size: (usize, usize, usize),
    accumulate: bool,
    post: Option<(Bias<'a>, (f32, f32), Activation)>,
}

/// Ranges of a product split over the pool's threads.
struct Plan {
    /// Output ranges (tasks), `step` rows or columns each.
    tasks: usize,
    split_n: bool,
    step: usize,
    rows: usize,
    cols: usize,
    k: usize,
}

impl Plan {
    /// Scratch parts a run takes: one when it stays on the calling thread, else one per
    /// thread of the pool (the pool hands each thread its own part).
    fn scratch_parts(&self, threads: usize) -> usize {
        if self.tasks == 1 {
            1
        } else {
            threads.max(1)
        }
    }
}

/// The part of `s` from its first 64-byte-aligned element.
fn aligned(s: &mut [f32]) -> &mut [f32] {
    let off = s
        .as_ptr()
        .align_offset(ALIGN * 4)
        .min(ALIGN - 1)
        .min(s.len());
    s.get_mut(off..).unwrap_or_default()
}

multiversion! {
    fn axpy<const FMA: bool>(y: &mut [f32], a: f32, x: &[f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = arch::madd::<FMA>(a, x, *y);
        }
    }
}

multiversion! {
    fn dot<const FMA: bool>(x: &[f32], y: &[f32]) -> f32 {
        let mut lanes = [0f32; 16];
        let (xs, ys) = (x.chunks_exact(16), y.chunks_exact(16));
        let tail: f32 = xs.remainder().iter().zip(ys.remainder()).map(|(a, b)| a * b).sum();
        for (a, b) in xs.zip(ys) {
            for ((l, &p), &q) in lanes.iter_mut().zip(a).zip(b) {
                *l = arch::madd::<FMA>(p, q, *l);
            }
        }
        lanes.iter().sum::<f32>() + tail
    }
}

/// `[x · w₀, x · w₁, …]` (each `w` as long as `x`).
fn dot_rows(isa: Isa, x: &[f32], w: [&[f32]; DOT_ROWS]) -> [f32; DOT_ROWS] {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = arch::Avx2::new().filter(|_| isa != Isa::Generic) {
        return s.vectorize(
            #[inline(always)]
            || dot_rows_on(s, x, w),
        );
    }
    let _ = isa; // only read on x86-64
    dot_rows_on(arch::Scalar::<false>, x, w)
}

#[inline(always)]
fn dot_rows_on<S: arch::Lanes>(s: S, x: &[f32], w: [&[f32]; DOT_ROWS]) -> [f32; DOT_ROWS] {
    // Whole vectors through zipped exact chunks, so that the loop carries no bounds
    // checks or short-load branches (with them it was instruction-bound, at two thirds
    // of the memory bandwidth alexnet's classifier reached without them); the tail once.
    let mut acc = [s.splat(0.0); DOT_ROWS];
    let rows = w.map(|w| w.get(..x.len()).unwrap_or(w).chunks_exact(S::LANES));
    let tails = rows.each_ref().map(|c| c.remainder());
    let xs = x.chunks_exact(S::LANES);
    let x_tail = xs.remainder();
    let [r0, r1, r2, r3, r4, r5, r6, r7] = rows;
    let quads = r0.zip(r1).zip(r2.zip(r3));
    let quads = quads.zip(r4.zip(r5).zip(r6.zip(r7)));
    for (xv, (((a, b), (c, d)), ((e, f), (g, h)))) in xs.zip(quads) {
        let xv = s.load(xv);
        for (acc, v) in acc.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *acc = s.fma(s.load(v), xv, *acc);
        }
    }
    if !x_tail.is_empty() {
        let xv = s.load(x_tail);
        for (a, t) in acc.iter_mut().zip(tails) {
            *a = s.fma(s.load(t), xv, *a);
        }
    }
    acc.map(|a| {
        let mut lanes = [0f32; 16];
        s.store(a, &mut lanes);
        lanes.iter().sum()
    })
}

#[cfg(test)]
pub(crate) mod tests;
