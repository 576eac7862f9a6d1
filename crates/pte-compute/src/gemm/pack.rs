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
        for (q, panel) in dst.chunks_exact_mut(kc * w).take(panels).enumerate() {
            let first = l0 + q * w;
            let valid = w.min((l0 + len).saturating_sub(first));
            if self.row_stride() == 1 && valid == w {
                // Lines contiguous: each depth step is a copy of w values.
                for (p, out) in panel.chunks_exact_mut(w).enumerate() {
                    let src = self.t().row_run(k0 + p, first, w);
                    match src {
                        Some(s) if s.len() == w => out.copy_from_slice(s),
                        _ => out
                            .iter_mut()
                            .enumerate()
                            .for_each(|(l, o)| *o = self.at(first + l, k0 + p)),
                    }
                }
                continue;
            }
            for l in 0..w {
                let run = if l < valid {
                    self.row_run(first + l, k0, kc)
                } else {
                    None
                };
                match run {
                    Some(r) if r.len() == kc => {
                        for (o, &v) in panel.iter_mut().skip(l).step_by(w).zip(r) {
                            *o = v;
                        }
                    }
                    _ => {
                        for (p, o) in panel.iter_mut().skip(l).step_by(w).enumerate() {
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
}

/// Elements of `len` lines packed in panels of `w` over `kc` depths.
pub(crate) fn packed_len(len: usize, kc: usize, w: usize) -> Option<usize> {
    len.div_ceil(w.max(1)).checked_mul(w)?.checked_mul(kc)
}
