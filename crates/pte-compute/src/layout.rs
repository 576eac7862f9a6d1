//! Batched 2-D transposes: the conversions between the NCHW layout of programs and the
//! NHWC (channels last) layout of [`crate::nhwc`] — NCHW to NHWC transposes each image's
//! `channels × pixels`, NHWC to NCHW its `pixels × channels` — and any transpose an
//! XNNPACK graph asks for on elements of any size.

use crate::error::{self, Error, Result};
use crate::pool::ThreadPool;

/// Output rows written at once: one cache line of `f32` read from each input row.
const BLOCK: usize = 16;

/// Elements below which a transpose stays on the calling thread.
const PARALLEL: usize = 1 << 15;

/// `y[n][c][r] = x[n][r][c]` for `batch` matrices of `rows × cols`, split over the
/// pool's threads when large.
pub fn transpose<T: Copy + Send + Sync>(
    pool: &ThreadPool,
    x: &[T],
    batch: usize,
    rows: usize,
    cols: usize,
    y: &mut [T],
) -> Result {
    let image = error::mul(rows, cols, "transpose")?;
    let len = error::mul(image, batch, "transpose")?;
    if x.len() != len || y.len() != len {
        return Err(Error::ShapeMismatch {
            what: format!(
                "transpose of {} values into {} for {batch} matrices of {rows} × {cols}",
                x.len(),
                y.len()
            ),
        });
    }
    if len == 0 {
        return Ok(());
    }
    if len < PARALLEL || pool.threads() == 1 {
        transpose_rows(x, rows, cols, 0, y);
        return Ok(());
    }
    pool.parallel_chunks(y, BLOCK * rows, &mut [0u8; 0], 0, |i, chunk, _| {
        transpose_rows(x, rows, cols, i * BLOCK, chunk);
    })
}

/// Output rows `g0..` (row `g` is column `g % cols` of matrix `g / cols`) into `y`,
/// which holds whole rows: up to [`BLOCK`] of them at a time, the input read row by
/// row.
fn transpose_rows<T: Copy>(x: &[T], rows: usize, cols: usize, g0: usize, y: &mut [T]) {
    let image = rows * cols;
    let mut g = g0;
    let mut out = y;
    while !out.is_empty() {
        let (n, c0) = (g / cols, g % cols);
        let cb = BLOCK.min(cols - c0).min(out.len() / rows);
        if cb == 0 {
            return;
        }
        let (head, tail) = out.split_at_mut(cb * rows);
        let src = x.get(n * image..(n + 1) * image).unwrap_or_default();
        for (r, line) in src.chunks_exact(cols).enumerate() {
            for (i, &v) in line.iter().skip(c0).take(cb).enumerate() {
                if let Some(o) = head.get_mut(i * rows + r) {
                    *o = v;
                }
            }
        }
        g += cb;
        out = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_match_the_definition() {
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads).unwrap();
            for (batch, c, p) in [
                (1, 3, 50176),
                (2, 17, 9),
                (1, 40, 1),
                (3, 1, 5),
                (2, 33, 999),
            ] {
                let x: Vec<f32> = (0..batch * c * p).map(|i| i as f32).collect();
                let mut y = vec![0.0; x.len()];
                transpose(&pool, &x, batch, c, p, &mut y).unwrap();
                for n in 0..batch {
                    for ch in 0..c {
                        for px in 0..p {
                            assert_eq!(y[n * c * p + px * c + ch], x[n * c * p + ch * p + px]);
                        }
                    }
                }
                let mut back = vec![0.0; x.len()];
                transpose(&pool, &y, batch, p, c, &mut back).unwrap();
                assert_eq!(back, x);
            }
            assert!(transpose(&pool, &[0.0; 5], 1, 2, 3, &mut [0.0; 6]).is_err());
        }
    }
}
