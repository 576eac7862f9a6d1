//! Packing operands into the panels the micro-kernels read.
//!
//! Both operands are seen as "lines × depth" matrices: A is m × k (a line is a row), B
//! is seen transposed, n × k (a line is a column of B). A block of lines
//! `l0..l0 + len` over depths `k0..k0 + kc` is packed in panels of `w` lines (`w` is
//! the micro-kernel's mr for A, nr for B): element (line l, depth p) of panel q sits at
//! `q * kc * w + p * w + (l - q * w)`, and lines past the end are zero.

use crate::arch::{self, multiversion, Isa};
use crate::mat::MatRef;

/// Something that can be packed in panels: a strided matrix, or a convolution's
/// implicit im2col matrix (see [`crate::conv`]).
pub(crate) trait Lines: Sync {
    /// Number of lines.
    fn lines(&self) -> usize;
    /// Depth (the k of the product).
    fn depth(&self) -> usize;
    /// Packs lines `l0..l0 + len` × depths `k0..k0 + kc` in panels of `w` lines into
    /// `dst` (at least `ceil(len / w) * w * kc` long).
    #[allow(clippy::too_many_arguments)] // the block's coordinates and the panel width
    fn pack(
        &self,
        isa: Isa,
        l0: usize,
        len: usize,
        k0: usize,
        kc: usize,
        w: usize,
        dst: &mut [f32],
    );

    /// Depths `k0..k0 + kc` of line `l` when they are contiguous in memory, so that a
    /// micro-kernel can read them in place instead of packing them.
    fn run_in_place(&self, _l: usize, _k0: usize, _kc: usize) -> Option<&[f32]> {
        None
    }
}

/// A strided matrix whose rows are the lines (pass `b.t()` for B).
impl Lines for MatRef<'_> {
    fn lines(&self) -> usize {
        self.rows()
    }

    fn depth(&self) -> usize {
        self.cols()
    }

    fn run_in_place(&self, l: usize, k0: usize, kc: usize) -> Option<&[f32]> {
        self.row_run(l, k0, kc).filter(|r| r.len() == kc)
    }

    #[allow(clippy::too_many_arguments)] // the block's coordinates and the panel width
    fn pack(
        &self,
        isa: Isa,
        l0: usize,
        len: usize,
        k0: usize,
        kc: usize,
        w: usize,
        dst: &mut [f32],
    ) {
        if kc == 0 || w == 0 {
            return;
        }
        let panels = len.div_ceil(w);
        let dst = dst.get_mut(..panels * kc * w).unwrap_or_default();
        if self.row_stride() == 1 {
            // Lines contiguous (B row-major, or A column-major): walk the source in
            // memory order, depth by depth, scattering runs of w values to the panels.
            let by_depth = self.t();
            for p in 0..kc {
                let run = by_depth.row_run(k0 + p, l0, len).unwrap_or_default();
                for (q, panel) in dst.chunks_exact_mut(kc * w).enumerate() {
                    let out = panel.get_mut(p * w..(p + 1) * w).unwrap_or_default();
                    let src = run.get(q * w..).unwrap_or_default();
                    if src.len() >= w {
                        out.copy_from_slice(src.get(..w).unwrap_or_default());
                    } else {
                        out.fill(0.0);
                        out.iter_mut().zip(src).for_each(|(o, &v)| *o = v);
                    }
                }
            }
            return;
        }
        // Lines along the depth (A row-major, B column-major): a transposition.
        transpose_panels(isa, self, l0, len, k0, kc, w, dst);
    }
}

/// Depths transposed at once.
const D: usize = 8;

/// One panel of `W` lines (`valid` of them real) transposed from rows contiguous along
/// the depth, `D` depths at a time through a register-sized block.
#[inline(always)]
#[allow(clippy::indexing_slicing)] // d < D and l < W index arrays of those lengths
fn transpose_panel<const W: usize>(
    src: &MatRef<'_>,
    first: usize,
    valid: usize,
    k0: usize,
    kc: usize,
    panel: &mut [f32],
) {
    let rows: [Option<&[f32]>; W] = std::array::from_fn(|l| {
        if l < valid {
            src.row_run(first + l, k0, kc).filter(|r| r.len() == kc)
        } else {
            Some(&[][..])
        }
    });
    if rows.iter().any(Option::is_none) {
        // Not contiguous after all: element by element.
        for (p, out) in panel.chunks_exact_mut(W).enumerate() {
            for (l, o) in out.iter_mut().enumerate() {
                *o = if l < valid {
                    src.at(first + l, k0 + p)
                } else {
                    0.0
                };
            }
        }
        return;
    }
    let rows: [&[f32]; W] = rows.map(Option::unwrap_or_default);
    let whole = kc / D * D;
    if W.is_multiple_of(D) && valid == W && whole > 0 {
        // Whole 8 × 8 blocks through register transposes, when this CPU has them.
        let moved = src.tail_from(first, k0).is_some_and(|s| {
            arch::transpose32(
                Isa::best(),
                (bytemuck::cast_slice(s), src.row_stride()),
                (bytemuck::cast_slice_mut(panel), W),
                W,
                whole,
            )
        });
        if !moved {
            transpose_blocks(&rows, whole, panel);
        }
    } else {
        transpose_blocks(&rows, whole, panel);
    }
    for (p, out) in panel.chunks_exact_mut(W).enumerate().skip(whole) {
        for (o, row) in out.iter_mut().zip(&rows) {
            *o = row.get(p).copied().unwrap_or(0.0);
        }
    }
}

/// Depths `..whole` (a multiple of `D`) of a panel, through a stack block.
#[inline(always)]
#[allow(clippy::indexing_slicing)] // d < D and l < W index arrays of those lengths
fn transpose_blocks<const W: usize>(rows: &[&[f32]; W], whole: usize, panel: &mut [f32]) {
    for (p0, block) in (0..whole).step_by(D).zip(panel.chunks_exact_mut(D * W)) {
        let mut t = [[0f32; W]; D];
        for (l, row) in rows.iter().enumerate() {
            if let Some(r) = row
                .get(p0..p0 + D)
                .and_then(|r| <&[f32; D]>::try_from(r).ok())
            {
                for d in 0..D {
                    t[d][l] = r[d];
                }
            }
        }
        for (out, t) in block.chunks_exact_mut(W).zip(&t) {
            out.copy_from_slice(t);
        }
    }
}

multiversion! {
    /// Packs lines contiguous along the depth (see [`Lines::pack`]).
    fn transpose_panels<const FMA: bool>(src: &MatRef<'_>, l0: usize, len: usize, k0: usize, kc: usize, w: usize, dst: &mut [f32]) {
        for (q, panel) in dst.chunks_exact_mut(kc * w).enumerate() {
            let first = l0 + q * w;
            let valid = w.min((l0 + len).saturating_sub(first));
            match w {
                4 => transpose_panel::<4>(src, first, valid, k0, kc, panel),
                6 => transpose_panel::<6>(src, first, valid, k0, kc, panel),
                8 => transpose_panel::<8>(src, first, valid, k0, kc, panel),
                12 => transpose_panel::<12>(src, first, valid, k0, kc, panel),
                16 => transpose_panel::<16>(src, first, valid, k0, kc, panel),
                32 => transpose_panel::<32>(src, first, valid, k0, kc, panel),
                _ => {
                    for (p, out) in panel.chunks_exact_mut(w).enumerate() {
                        for (l, o) in out.iter_mut().enumerate() {
                            *o = if l < valid { src.at(first + l, k0 + p) } else { 0.0 };
                        }
                    }
                }
            }
        }
    }
}

/// Elements of `len` lines packed in panels of `w` over `kc` depths.
pub(crate) fn packed_len(len: usize, kc: usize, w: usize) -> Option<usize> {
    len.div_ceil(w.max(1)).checked_mul(w)?.checked_mul(kc)
}
