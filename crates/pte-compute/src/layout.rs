//! Batched 2-D transposes: the conversions between the NCHW layout of programs and the
//! NHWC (channels last) layout of [`crate::nhwc`] — NCHW to NHWC transposes each image's
//! `channels × pixels`, NHWC to NCHW its `pixels × channels` — and any transpose an
//! XNNPACK graph asks for on elements of any size.

use crate::arch::{self, Isa};
use crate::error::{self, Error, Result};
use crate::pool::ThreadPool;

/// Output rows a task of the pool writes at once.
const BLOCK: usize = 16;
/// Side of a tile: one cache line of `f32` read from each of as many input rows.
const TILE: usize = 16;

/// Elements below which a transpose stays on the calling thread.
const PARALLEL: usize = 1 << 15;

/// `y[n][c][r] = x[n][r][c]` for `batch` matrices of `rows × cols`, split over the
/// pool's threads when large.
pub fn transpose<T: bytemuck::Pod + Send + Sync>(
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
    let isa = Isa::best();
    if len < PARALLEL || pool.threads() == 1 {
        transpose_rows(isa, x, rows, cols, 0, y);
        return Ok(());
    }
    pool.parallel_chunks(y, BLOCK * rows, &mut [0u8; 0], 0, |i, chunk, _| {
        transpose_rows(isa, x, rows, cols, i * BLOCK, chunk);
    })
}

/// Output rows `g0..` (row `g` is column `g % cols` of matrix `g / cols`) into `y`,
/// which holds whole rows. Tiles of [`TILE`] input rows × [`TILE`] columns, the tiles
/// of one band of input rows before the next: the input is read through `TILE` streams
/// at a time (reading all rows at once, up to hundreds of channels, defeated the
/// prefetchers: 1.6 GB/s on 96 channels of 112 × 112), and each output row receives a
/// cache line per band. Whole tiles of 32-bit values go through register transposes.
fn transpose_rows<T: bytemuck::Pod>(
    isa: Isa,
    x: &[T],
    rows: usize,
    cols: usize,
    g0: usize,
    y: &mut [T],
) {
    let image = rows * cols;
    let count = y.len() / rows.max(1);
    let mut done = 0;
    while done < count {
        // A run of output rows inside one matrix.
        let g = g0 + done;
        let (n, c0) = (g / cols, g % cols);
        let run = (cols - c0).min(count - done);
        let src = x.get(n * image..(n + 1) * image).unwrap_or_default();
        let dst = y
            .get_mut(done * rows..(done + run) * rows)
            .unwrap_or_default();
        for r0 in (0..rows).step_by(TILE) {
            let rb = TILE.min(rows - r0);
            for j0 in (0..run).step_by(TILE) {
                let jb = TILE.min(run - j0);
                let at = r0 * cols + c0 + j0;
                if rb == TILE
                    && jb == TILE
                    && tile_32(isa, src, (at, cols), dst, (j0 * rows + r0, rows))
                {
                    continue;
                }
                for r in r0..r0 + rb {
                    let at = r * cols + c0 + j0;
                    let line = src.get(at..at + jb).unwrap_or_default();
                    for (j, &v) in line.iter().enumerate() {
                        if let Some(o) = dst.get_mut((j0 + j) * rows + r) {
                            *o = v;
                        }
                    }
                }
            }
        }
        done += run;
    }
}

/// A whole `TILE × TILE` tile of 32-bit values, from `src[s0..]` (rows `ss` apart) to
/// `dst[d0..]` (rows `ds` apart), as four 8 × 8 register transposes; false (the caller
/// copies the tile) for other element sizes or when the CPU has no such kernel.
fn tile_32<T: bytemuck::Pod>(
    isa: Isa,
    src: &[T],
    (s0, ss): (usize, usize),
    dst: &mut [T],
    (d0, ds): (usize, usize),
) -> bool {
    if std::mem::size_of::<T>() != 4 {
        return false;
    }
    let (Ok(src), Ok(dst)) = (
        bytemuck::try_cast_slice::<T, u32>(src),
        bytemuck::try_cast_slice_mut::<T, u32>(dst),
    ) else {
        return false;
    };
    [(0, 0), (0, 8), (8, 0), (8, 8)].into_iter().all(|(i, j)| {
        let s = src.get(s0 + i * ss + j..).unwrap_or_default();
        let d = dst.get_mut(d0 + j * ds + i..).unwrap_or_default();
        arch::transpose8x8(isa, s, ss, d, ds)
    })
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
                (1, 96, 200),
                (2, 48, 40),
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

    /// Elements of other sizes take the element-wise path; 32-bit ones keep every bit
    /// (NaN payloads included) through the register transposes.
    #[test]
    fn every_element_size_is_moved_whole() {
        fn check<T: bytemuck::Pod + Send + Sync + PartialEq + std::fmt::Debug>(of: fn(usize) -> T) {
            let pool = ThreadPool::new(2).unwrap();
            let (batch, c, p) = (2, 40, 1000);
            let x: Vec<T> = (0..batch * c * p).map(of).collect();
            let mut y = vec![of(0); x.len()];
            transpose(&pool, &x, batch, c, p, &mut y).unwrap();
            for n in 0..batch {
                for ch in 0..c {
                    for px in 0..p {
                        assert_eq!(y[n * c * p + px * c + ch], x[n * c * p + ch * p + px]);
                    }
                }
            }
        }
        check(|i| i as u8);
        check(|i| i as u16);
        check(|i| 0x7fc0_0000 | i as u32);
        check(|i| (i as u64) << 33 | 1);
    }
}
