//! Packing operands into the panels the micro-kernels read.
//!
//! Both operands are seen as "lines × depth" matrices: A is m × k (a line is a row), B
//! is seen transposed, n × k (a line is a column of B). A block of lines
//! `l0..l0 + len` over depths `k0..k0 + kc` is packed in panels of `w` lines (`w` is
//! the micro-kernel's mr for A, nr for B): element (line l, depth p) of panel q sits at
//! `q * kc * w + p * w + (l - q * w)`, and lines past the end are zero.

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
    fn pack(&self, l0: usize, len: usize, k0: usize, kc: usize, w: usize, dst: &mut [f32]);
}

/// A strided matrix whose rows are the lines (pass `b.t()` for B).
impl Lines for MatRef<'_> {
    fn lines(&self) -> usize {
        self.rows()
    }

    fn depth(&self) -> usize {
        self.cols()
    }

    fn pack(&self, l0: usize, len: usize, k0: usize, kc: usize, w: usize, dst: &mut [f32]) {
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
        // Lines along the depth (A row-major, B column-major): transpose blocks of
        // `D` depths of every line of a panel through registers.
        const D: usize = 8;
        for (q, panel) in dst.chunks_exact_mut(kc * w).enumerate() {
            let first = l0 + q * w;
            let valid = w.min((l0 + len).saturating_sub(first));
            let rows: [Option<&[f32]>; MAX_W] = std::array::from_fn(|l| {
                (l < valid)
                    .then(|| self.row_run(first + l, k0, kc))
                    .flatten()
                    .filter(|r| r.len() == kc)
            });
            let (whole, tail) = (kc / D * D, kc % D);
            for (p0, block) in (0..whole).step_by(D).zip(panel.chunks_exact_mut(D * w)) {
                for (l, row) in rows.iter().take(w).enumerate() {
                    let vals: [f32; D] = match row {
                        Some(r) => std::array::from_fn(|d| r.get(p0 + d).copied().unwrap_or(0.0)),
                        None if l < valid => {
                            std::array::from_fn(|d| self.at(first + l, k0 + p0 + d))
                        }
                        None => [0.0; D],
                    };
                    for (d, v) in vals.into_iter().enumerate() {
                        if let Some(o) = block.get_mut(d * w + l) {
                            *o = v;
                        }
                    }
                }
            }
            for p in whole..whole + tail {
                for l in 0..w {
                    if let Some(o) = panel.get_mut(p * w + l) {
                        *o = if l < valid {
                            self.at(first + l, k0 + p)
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

/// Widest panel of any micro-kernel.
const MAX_W: usize = 32;

/// Elements of `len` lines packed in panels of `w` over `kc` depths.
pub(crate) fn packed_len(len: usize, kc: usize, w: usize) -> Option<usize> {
    len.div_ceil(w.max(1)).checked_mul(w)?.checked_mul(kc)
}
