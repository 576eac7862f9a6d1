//! Strided matrix views: [`MatRef`] (read) and [`MatMut`] (write), checked once at
//! construction so that every element they name lies inside their buffer.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Offset of the last element of a `rows × cols` view, None if empty or overflowing.
fn last_offset(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<Option<usize>> {
    if rows == 0 || cols == 0 {
        return Some(None);
    }
    let a = (rows - 1).checked_mul(rs)?;
    let b = (cols - 1).checked_mul(cs)?;
    a.checked_add(b).map(Some)
}

fn check_view(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> Result {
    match last_offset(rows, cols, rs, cs) {
        Some(None) => Ok(()),
        Some(Some(last)) if last < len => Ok(()),
        _ => Err(Error::ViewOutOfBounds {
            rows,
            cols,
            row_stride: rs,
            col_stride: cs,
            len,
        }),
    }
}

/// A read-only strided matrix: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatRef<'a> {
    /// A view with row stride `rs` and column stride `cs`, checked against `data`.
    pub fn new(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Result<Self> {
        check_view(data.len(), rows, cols, rs, cs)?;
        Ok(Self {
            data,
            rows,
            cols,
            rs,
            cs,
        })
    }

    /// A row-major view of the first `rows * cols` elements.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Result<Self> {
        Self::new(data, rows, cols, cols, 1)
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            data: self.data,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row stride.
    pub fn row_stride(&self) -> usize {
        self.rs
    }

    /// Column stride.
    pub fn col_stride(&self) -> usize {
        self.cs
    }

    /// Element (i, j); 0 outside the view.
    #[inline]
    pub fn at(&self, i: usize, j: usize) -> f32 {
        if i < self.rows && j < self.cols {
            self.data
                .get(i * self.rs + j * self.cs)
                .copied()
                .unwrap_or(0.0)
        } else {
            0.0
        }
    }

    /// Elements `(i, j0..j0 + len)` when columns are contiguous (`cs == 1`), clipped to
    /// the view.
    #[inline]
    pub(crate) fn row_run(&self, i: usize, j0: usize, len: usize) -> Option<&'a [f32]> {
        if self.cs != 1 && self.cols > 1 || i >= self.rows || j0 >= self.cols {
            return None;
        }
        let len = len.min(self.cols - j0);
        self.data.get(i * self.rs + j0..)?.get(..len)
    }

    /// The data from element `(i, j)` to the end, when columns are contiguous
    /// (`cs == 1`): a block of rows `i..` read with the row stride.
    #[inline]
    pub(crate) fn tail_from(&self, i: usize, j: usize) -> Option<&'a [f32]> {
        if self.cs != 1 && self.cols > 1 || i >= self.rows || j >= self.cols {
            return None;
        }
        self.data.get(i * self.rs + j..)
    }
}

/// A writable strided matrix whose distinct elements are distinct memory.
///
/// Like `ndarray`'s views it holds a raw pointer, so that it can be split into
/// disjoint sub-views (by rows or by columns) that threads write at the same time; no
/// slice covering another view's elements is ever formed.
#[derive(Debug)]
pub struct MatMut<'a> {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: a `MatMut` is a unique borrow of its elements (as `&mut [f32]`, which is Send).
unsafe impl Send for MatMut<'_> {}

impl<'a> MatMut<'a> {
    /// A view with row stride `rs` and column stride `cs`, checked against `data` and
    /// for overlapping elements.
    pub fn new(
        data: &'a mut [f32],
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
    ) -> Result<Self> {
        check_view(data.len(), rows, cols, rs, cs)?;
        // Injective when the inner stride is non-zero and the outer one steps over a
        // whole inner line (an extent of 1 has no stride to speak of).
        let line = |inner: usize, extent: usize, outer: usize, outer_extent: usize| {
            (extent == 1 || inner >= 1)
                && (outer_extent == 1
                    || extent.checked_mul(inner.max(1)).is_some_and(|l| outer >= l))
        };
        let empty = rows == 0 || cols == 0;
        if !(empty || line(cs, cols, rs, rows) || line(rs, rows, cs, cols)) {
            return Err(Error::OverlappingOutput {
                rows,
                cols,
                row_stride: rs,
                col_stride: cs,
            });
        }
        Ok(Self {
            ptr: data.as_mut_ptr(),
            rows,
            cols,
            rs,
            cs,
            _borrow: PhantomData,
        })
    }

    /// A row-major view of the first `rows * cols` elements.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Result<Self> {
        Self::new(data, rows, cols, cols, 1)
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row stride.
    pub fn row_stride(&self) -> usize {
        self.rs
    }

    /// Column stride.
    pub fn col_stride(&self) -> usize {
        self.cs
    }

    /// A shorter-lived view of the same elements.
    pub fn reborrow(&mut self) -> MatMut<'_> {
        MatMut {
            _borrow: PhantomData,
            ..*self
        }
    }

    /// Splits into rows `..at` and `at..` (`at` clamped to the rows).
    pub fn split_at_row(self, at: usize) -> (Self, Self) {
        let at = at.min(self.rows);
        // A dangling pointer is fine for an empty view: it is never dereferenced.
        let ptr = self.ptr.wrapping_add(at * self.rs);
        (
            Self {
                rows: at,
                _borrow: PhantomData,
                ..self
            },
            Self {
                ptr,
                rows: self.rows - at,
                _borrow: PhantomData,
                ..self
            },
        )
    }

    /// Splits into columns `..at` and `at..` (`at` clamped to the columns).
    pub fn split_at_col(self, at: usize) -> (Self, Self) {
        let at = at.min(self.cols);
        // As in `split_at_row`.
        let ptr = self.ptr.wrapping_add(at * self.cs);
        (
            Self {
                cols: at,
                _borrow: PhantomData,
                ..self
            },
            Self {
                ptr,
                cols: self.cols - at,
                _borrow: PhantomData,
                ..self
            },
        )
    }

    /// Splits into parts of `step` columns (`by_cols`) or rows each, at most
    /// [`MAX_PARTS`] (the last takes the rest), for threads to write at once.
    pub(crate) fn into_parts(self, by_cols: bool, step: usize) -> MatParts<'a> {
        let (rows, cols, across) = if by_cols {
            (self.rows, step, MAX_PARTS)
        } else {
            (step, self.cols, 1)
        };
        MatParts::new(self, rows, cols, across, true)
    }

    /// Splits into a grid of blocks of `rows` rows and `cols` columns, numbered row
    /// by row (those past [`MAX_PARTS`] are not handed out: the caller keeps the grid
    /// smaller), for threads to write at once.
    pub(crate) fn into_grid(self, rows: usize, cols: usize) -> MatParts<'a> {
        let across = self.cols.div_ceil(cols.max(1)).max(1);
        MatParts::new(self, rows, cols, across, false)
    }

    /// Element (i, j), None outside the view.
    pub fn get(&self, i: usize, j: usize) -> Option<f32> {
        // SAFETY: in-view elements are inside the borrowed buffer (checked at `new`).
        (i < self.rows && j < self.cols)
            .then(|| unsafe { *self.ptr.add(i * self.rs + j * self.cs) })
    }

    /// Sets element (i, j); false outside the view.
    pub fn set(&mut self, i: usize, j: usize, v: f32) -> bool {
        let inside = i < self.rows && j < self.cols;
        if inside {
            // SAFETY: as `get`; `&mut self` makes the write exclusive.
            unsafe { *self.ptr.add(i * self.rs + j * self.cs) = v };
        }
        inside
    }

    /// Elements `(i, j0..j0 + len)` as a slice when columns are contiguous, clipped to
    /// the view; None if `cs != 1` (with more than one column) or out of range.
    pub fn row_run(&mut self, i: usize, j0: usize, len: usize) -> Option<&mut [f32]> {
        if self.cs != 1 && self.cols > 1 || i >= self.rows || j0 >= self.cols {
            return None;
        }
        let len = len.min(self.cols - j0);
        // SAFETY: the run is `len` contiguous in-view elements of row i; no other view
        // can hold them (views only split this one's rows and columns apart).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.rs + j0), len) })
    }

    /// Rows `i0..i0 + n` as one slice when they are contiguous (`cs == 1` and rows
    /// `cols` apart), clipped to the view; None otherwise.
    pub(crate) fn rows_run(&mut self, i0: usize, n: usize) -> Option<&mut [f32]> {
        if self.cs != 1 || self.rs != self.cols || i0 >= self.rows {
            return None;
        }
        let len = n.min(self.rows - i0).checked_mul(self.cols)?;
        // SAFETY: whole in-view rows, contiguous since rows are `cols` apart; no other
        // view can hold them (views only split this one's rows and columns apart).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i0 * self.rs), len) })
    }

    /// The tile at (i, j) of `rows × cols` elements with contiguous columns, as a raw
    /// pointer and row stride for a micro-kernel; None unless the tile is inside the
    /// view and `cs == 1`.
    pub(crate) fn tile_ptr(
        &mut self,
        i: usize,
        j: usize,
        rows: usize,
        cols: usize,
    ) -> Option<(*mut f32, usize)> {
        let inside = rows >= 1
            && cols >= 1
            && i.checked_add(rows).is_some_and(|e| e <= self.rows)
            && j.checked_add(cols).is_some_and(|e| e <= self.cols)
            && (self.cs == 1 || cols == 1);
        // SAFETY: (i, j) is inside the view, so its offset is inside the buffer.
        inside.then(|| (unsafe { self.ptr.add(i * self.rs + j * self.cs) }, self.rs))
    }
}

/// Most parts [`MatMut::into_parts`] makes.
pub(crate) const MAX_PARTS: usize = 64;

/// Disjoint parts of a [`MatMut`], each handed out once ([`MatParts::take`]) to the
/// thread that writes it. A part's view is computed when it is taken: building all
/// [`MAX_PARTS`] views up front took a 128 × 512 vector-matrix product's caller about
/// 0.6 µs of its 2 µs share at 2 threads.
pub(crate) struct MatParts<'a> {
    whole: MatMut<'a>,
    /// Rows and columns of a part; parts per row of the grid.
    rows: usize,
    cols: usize,
    across: usize,
    /// The last part extends to the end of the view (a split along one dimension).
    last_takes_rest: bool,
    /// Bit `t`: part `t` was handed out.
    taken: AtomicU64,
}

// SAFETY: `take` hands out each part once (the `taken` bit), and parts are disjoint
// blocks of a view whose distinct elements are distinct memory; a part is a `MatMut`,
// which is Send.
unsafe impl Sync for MatParts<'_> {}

impl<'a> MatParts<'a> {
    fn new(whole: MatMut<'a>, rows: usize, cols: usize, across: usize, rest: bool) -> Self {
        Self {
            whole,
            rows,
            cols,
            across: across.max(1),
            last_takes_rest: rest,
            taken: AtomicU64::new(0),
        }
    }

    /// Part `t`, the first time it is asked for (empty past the view's end).
    pub(crate) fn take(&self, t: usize) -> Option<MatMut<'a>> {
        let bit = 1u64.checked_shl(u32::try_from(t).ok()?)?;
        if t >= MAX_PARTS || self.taken.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
            return None;
        }
        let w = &self.whole;
        let (r, c) = (t / self.across, t % self.across);
        let i0 = r.saturating_mul(self.rows).min(w.rows);
        let j0 = c.saturating_mul(self.cols).min(w.cols);
        let (mut i1, mut j1) = (
            i0.saturating_add(self.rows).min(w.rows),
            j0.saturating_add(self.cols).min(w.cols),
        );
        if self.last_takes_rest && t + 1 == MAX_PARTS {
            if self.across == 1 {
                i1 = w.rows;
            } else {
                j1 = w.cols;
            }
        }
        Some(MatMut {
            // In bounds unless the part is empty (then never dereferenced, and the
            // offset may wrap).
            ptr: w
                .ptr
                .wrapping_add(i0.wrapping_mul(w.rs).wrapping_add(j0.wrapping_mul(w.cs))),
            rows: i1 - i0,
            cols: j1 - j0,
            rs: w.rs,
            cs: w.cs,
            _borrow: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_rows_come_as_one_run() {
        let mut data: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut m = MatMut::row_major(&mut data, 3, 4).unwrap();
        assert_eq!(
            m.rows_run(1, 5).unwrap(),
            &[4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
        );
        assert!(m.rows_run(3, 1).is_none());
        // Rows of a column split are not contiguous.
        let (mut left, _) = m.split_at_col(2);
        assert!(left.rows_run(0, 1).is_none());
        assert_eq!(left.row_run(1, 0, 2).unwrap(), &[4.0, 5.0]);
    }

    #[test]
    fn views_are_checked() {
        let v = [0f32; 6];
        assert!(MatRef::new(&v, 2, 3, 3, 1).is_ok());
        assert!(MatRef::new(&v, 2, 4, 3, 1).is_err());
        assert!(MatRef::new(&v, 0, 100, 1000, 1).is_ok());
        assert!(MatRef::new(&v, 2, 2, usize::MAX, 1).is_err());
        let mut w = [0f32; 6];
        assert!(MatMut::new(&mut w, 2, 3, 1, 1).is_err());
        assert!(MatMut::new(&mut w, 2, 3, 1, 2).is_ok());
        assert!(MatMut::new(&mut w, 1, 3, 0, 1).is_ok());
        assert!(MatMut::new(&mut w, 4, 0, 0, 1).is_ok());
        assert!(MatMut::new(&mut w, 3, 2, 2, 1).is_ok());
    }

    #[test]
    fn grids_cover_the_matrix_once() {
        let mut w = vec![0f32; 7 * 5];
        let parts = MatMut::row_major(&mut w, 7, 5).unwrap().into_grid(3, 2);
        for t in 0..9 {
            let mut part = parts.take(t).unwrap();
            assert!(parts.take(t).is_none());
            for i in 0..part.rows() {
                for j in 0..part.cols() {
                    assert!(part.set(i, j, part.get(i, j).unwrap() + t as f32 + 1.0));
                }
            }
        }
        // Rows 0-2, 3-5 and 6; columns 0-1, 2-3 and 4.
        let want = |i: usize, j: usize| (i / 3 * 3 + j / 2 + 1) as f32;
        for (k, &v) in w.iter().enumerate() {
            assert_eq!(v, want(k / 5, k % 5), "element {k}");
        }
    }

    #[test]
    fn parts_cover_the_matrix_once() {
        for by_cols in [true, false] {
            let (rows, cols) = if by_cols { (2, 7) } else { (7, 2) };
            let mut w = vec![0f32; 14];
            let parts = MatMut::row_major(&mut w, rows, cols)
                .unwrap()
                .into_parts(by_cols, 3);
            for t in 0..3 {
                let mut part = parts.take(t).unwrap();
                assert!(parts.take(t).is_none());
                for i in 0..part.rows() {
                    for j in 0..part.cols() {
                        assert!(part.set(i, j, t as f32 + 1.0));
                    }
                }
            }
            let past = parts.take(3).unwrap();
            assert_eq!(past.rows() * past.cols(), 0);
            assert!(parts.take(MAX_PARTS).is_none());
            let want = |i: usize, j: usize| (if by_cols { j } else { i } / 3 + 1) as f32;
            for (k, &v) in w.iter().enumerate() {
                assert_eq!(v, want(k / cols, k % cols), "element {k}");
            }
        }
        // The last part takes what the others leave.
        let mut w = vec![0f32; MAX_PARTS + 5];
        let parts = MatMut::row_major(&mut w, 1, MAX_PARTS + 5)
            .unwrap()
            .into_parts(true, 1);
        assert_eq!(parts.take(MAX_PARTS - 1).unwrap().cols(), 6);
        assert_eq!(parts.take(0).unwrap().cols(), 1);
    }

    #[test]
    fn splits_are_disjoint_views() {
        let mut w: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let m = MatMut::row_major(&mut w, 3, 4).unwrap();
        let (mut l, mut r) = m.split_at_col(1);
        assert_eq!((l.cols(), r.cols()), (1, 3));
        assert_eq!(r.get(2, 0), Some(9.0));
        assert!(r.set(0, 2, -1.0));
        assert!(!l.set(0, 1, 0.0));
        assert_eq!(l.row_run(1, 0, 9).map(|s| s.len()), Some(1));
        let (top, bottom) = r.split_at_row(2);
        assert_eq!((top.rows(), bottom.rows()), (2, 1));
        assert_eq!(bottom.get(0, 0), Some(9.0));
        assert_eq!(w[3], -1.0);
    }
}
