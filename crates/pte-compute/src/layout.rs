//! Batched 2-D transposes: the conversions between the NCHW layout of programs and the
//! NHWC (channels last) layout of [`crate::nhwc`] — NCHW to NHWC transposes each image's
//! `channels × pixels`, NHWC to NCHW its `pixels × channels` — and any transpose an
//! XNNPACK graph asks for on elements of any size.

use crate::arch::{self, Isa};
use crate::error::{self, Error, Result};
use crate::pool::ThreadPool;

/// Output rows a task of the pool writes at once.
const BLOCK: usize = 16;
/// Side of a tile of bytes: 16 bytes read from each of as many input rows.
const TILE: usize = 16;
/// Input rows of 32-bit values transposed as one band, eight columns at a time: each
/// output row receives 512 contiguous bytes per band. Bands of 16 rows (a cache line
/// per output row) ran at 21 GB/s on shufflenet's 784 × 116 and 58 × 784; 128 rows at
/// 34 GB/s (12544 × 96: 15 → 25 GB/s; 32 × 12544 unchanged).
const BAND: usize = 128;

/// Elements a task of the pool moves at least.
const MIN_TASK: usize = 4096;
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
    // Output rows per task: BLOCK, or more when rows are short (a task of BLOCK rows
    // of two values would cost more to hand out than to copy).
    let per = BLOCK.max(MIN_TASK / rows.max(1));
    pool.parallel_chunks(y, per * rows, &mut [0u8; 0], 0, |i, chunk, _| {
        transpose_rows(isa, x, rows, cols, i * per, chunk);
    })
}

/// Output rows `c0..` of one matrix of 2 to 4 rows into `dst` (whole rows): each
/// gathers one value of every input row, a channel shuffle's interleave, in loops that
/// vectorize (the tiles below went value by value for so few rows: 0.9 ns a byte on
/// shufflenet's shuffles). False, with nothing written, for other row counts.
fn interleave<T: bytemuck::Pod>(
    src: &[T],
    rows: usize,
    cols: usize,
    c0: usize,
    dst: &mut [T],
) -> bool {
    fn lines<T: bytemuck::Pod, const R: usize>(src: &[T], cols: usize, c0: usize, dst: &mut [T]) {
        let lines: [&[T]; R] =
            std::array::from_fn(|r| src.get(r * cols + c0..(r + 1) * cols).unwrap_or_default());
        interleave_lines(lines, dst);
    }
    match rows {
        2 => lines::<T, 2>(src, cols, c0, dst),
        3 => lines::<T, 3>(src, cols, c0, dst),
        4 => lines::<T, 4>(src, cols, c0, dst),
        _ => return false,
    }
    true
}

/// `dst[j · R + r] = lines[r][j]` for the `j` all lines and `dst` hold. One to four
/// lines go through zipped iterators, which vectorize into register shuffles; through
/// checked indexing each value went alone (8.5% of shufflenet_v2's time).
pub(crate) fn interleave_lines<T: bytemuck::Pod, const R: usize>(lines: [&[T]; R], dst: &mut [T]) {
    match lines.as_slice() {
        [a] => {
            for (o, &a) in dst.iter_mut().zip(*a) {
                *o = a;
            }
        }
        [a, b] => {
            let (out, _) = dst.as_chunks_mut::<2>();
            for ((o, &a), &b) in out.iter_mut().zip(*a).zip(*b) {
                *o = [a, b];
            }
        }
        [a, b, c] => {
            let (out, _) = dst.as_chunks_mut::<3>();
            for (((o, &a), &b), &c) in out.iter_mut().zip(*a).zip(*b).zip(*c) {
                *o = [a, b, c];
            }
        }
        [a, b, c, d] => {
            let (out, _) = dst.as_chunks_mut::<4>();
            for ((((o, &a), &b), &c), &d) in out.iter_mut().zip(*a).zip(*b).zip(*c).zip(*d) {
                *o = [a, b, c, d];
            }
        }
        _ => {
            let (out, _) = dst.as_chunks_mut::<R>();
            let n = lines
                .iter()
                .map(|l| l.len())
                .min()
                .unwrap_or(0)
                .min(out.len());
            for (j, o) in out.iter_mut().take(n).enumerate() {
                for (v, line) in o.iter_mut().zip(&lines) {
                    if let Some(&x) = line.get(j) {
                        *v = x;
                    }
                }
            }
        }
    }
}

/// Output rows `g0..` (row `g` is column `g % cols` of matrix `g / cols`) into `y`,
/// which holds whole rows. Matrices of 2-4 rows interleave; 32-bit values go through
/// register transposes in bands ([`words`]); other values in tiles of [`TILE`] input
/// rows × [`TILE`] columns, the tiles of one band of input rows before the next (the
/// input read through `TILE` streams at a time: reading all rows at once, up to
/// hundreds of channels, defeated the prefetchers), whole tiles of bytes through a
/// 16 × 16 register transpose (SSE2).
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
        if interleave(src, rows, cols, c0, dst) || words(isa, src, (rows, cols), c0, dst) {
            done += run;
            continue;
        }
        for r0 in (0..rows).step_by(TILE) {
            let rb = TILE.min(rows - r0);
            for j0 in (0..run).step_by(TILE) {
                let jb = TILE.min(run - j0);
                let at = r0 * cols + c0 + j0;
                if rb == TILE
                    && jb == TILE
                    && bytes_tile(src, (at, cols), dst, (j0 * rows + r0, rows))
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

/// Output rows `c0..` of one matrix of `rows × cols` 32-bit values into `dst` (whole
/// rows) on register transposes, in bands of [`BAND`] input rows (the edges of 8 × 8
/// blocks value by value). False, with nothing written, for other element sizes or
/// when this CPU has no such kernel.
fn words<T: bytemuck::Pod>(
    isa: Isa,
    src: &[T],
    (rows, cols): (usize, usize),
    c0: usize,
    dst: &mut [T],
) -> bool {
    if std::mem::size_of::<T>() != 4 || !arch::has_transpose32(isa) {
        return false;
    }
    let (Ok(src), Ok(dst)) = (
        bytemuck::try_cast_slice::<T, u32>(src),
        bytemuck::try_cast_slice_mut::<T, u32>(dst),
    ) else {
        return false;
    };
    let run = dst.len() / rows.max(1);
    (0..rows).step_by(BAND).all(|r0| {
        arch::transpose32(
            isa,
            (src.get(r0 * cols + c0..).unwrap_or_default(), cols),
            (dst.get_mut(r0..).unwrap_or_default(), rows),
            BAND.min(rows - r0),
            run,
        )
    })
}

/// A whole `TILE × TILE` tile of bytes from `src[s0..]` (rows `ss` apart) to
/// `dst[d0..]` (rows `ds` apart), as four 8 × 8 transposes by `eight`. False (the
/// caller copies the tile) when `eight` declines.
fn tile(
    src: &[u8],
    (s0, ss): (usize, usize),
    dst: &mut [u8],
    (d0, ds): (usize, usize),
    eight: impl Fn(&[u8], usize, &mut [u8], usize) -> bool,
) -> bool {
    [(0, 0), (0, 8), (8, 0), (8, 8)].into_iter().all(|(i, j)| {
        let s = src.get(s0 + i * ss + j..).unwrap_or_default();
        let d = dst.get_mut(d0 + j * ds + i..).unwrap_or_default();
        eight(s, ss, d, ds)
    })
}

/// A whole `TILE × TILE` tile of bytes (as [`tile`]) on a register transpose, else
/// as four 8 × 8 word transposes; false for other element sizes.
fn bytes_tile<T: bytemuck::Pod>(
    src: &[T],
    (s0, ss): (usize, usize),
    dst: &mut [T],
    (d0, ds): (usize, usize),
) -> bool {
    let (Ok(s), Ok(d)) = (
        bytemuck::try_cast_slice::<T, u8>(src),
        bytemuck::try_cast_slice_mut::<T, u8>(dst),
    ) else {
        return false;
    };
    if std::mem::size_of::<T>() != 1 {
        return false;
    }
    let whole = arch::transpose16x16_bytes(
        s.get(s0..).unwrap_or_default(),
        ss,
        d.get_mut(d0..).unwrap_or_default(),
        ds,
    );
    whole || tile(s, (s0, ss), d, (d0, ds), transpose_bytes_8x8)
}

/// `dst[c · ds + r] = src[r · ss + c]` for `r, c < 8`: each row a little-endian word,
/// the 8 × 8 byte matrix transposed by swapping 4 × 4, 2 × 2, then 1 × 1 blocks across
/// word pairs. False (nothing written) if a row lies outside.
fn transpose_bytes_8x8(src: &[u8], ss: usize, dst: &mut [u8], ds: usize) -> bool {
    let mut w = [0u64; 8];
    for (r, word) in w.iter_mut().enumerate() {
        match src
            .get(r * ss..r * ss + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
        {
            Some(b) => *word = u64::from_le_bytes(b),
            None => return false,
        }
    }
    if dst.len() < 7 * ds + 8 {
        return false;
    }
    // Byte c of word r is element (r, c). At each step, rows r and r + k exchange the
    // blocks of k bytes that lie across the diagonal.
    for (k, mask) in [
        (4, 0x0000_0000_ffff_ffff_u64),
        (2, 0x0000_ffff_0000_ffff),
        (1, 0x00ff_00ff_00ff_00ff),
    ] {
        let shift = 8 * k;
        for pair in w.chunks_exact_mut(2 * k) {
            let (lo, hi) = pair.split_at_mut(k);
            for (a, b) in lo.iter_mut().zip(hi) {
                // a's high blocks and b's low blocks swap places.
                let t = ((*a >> shift) ^ *b) & mask;
                *a ^= t << shift;
                *b ^= t;
            }
        }
    }
    for (c, word) in w.iter().enumerate() {
        if let Some(d) = dst.get_mut(c * ds..c * ds + 8) {
            d.copy_from_slice(&word.to_le_bytes());
        }
    }
    true
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
                // Bands and blocks with edges of every width below eight.
                (1, 58, 31),
                (2, 9, 23),
                (1, 464, 49),
                // Two to four rows interleave (channel shuffles), whole matrices and,
                // split between threads, runs of them.
                (3, 2, 58),
                (2, 4, 37),
                (1, 2, 40000),
                (700, 2, 58),
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

    /// Elements of 16 and 64 bits take the element-wise path, bytes the word tiles;
    /// 32-bit ones keep every bit (NaN payloads included) through the register
    /// transposes.
    #[test]
    fn every_element_size_is_moved_whole() {
        fn check<T: bytemuck::Pod + Send + Sync + PartialEq + std::fmt::Debug>(
            of: fn(usize) -> T,
            (batch, c, p): (usize, usize, usize),
        ) {
            let pool = ThreadPool::new(2).unwrap();
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
        let shape = (2, 40, 1000);
        check(|i| i as u8, shape);
        check(|i| i as u16, shape);
        check(|i| 0x7fc0_0000 | i as u32, shape);
        check(|i| (i as u64) << 33 | 1, shape);
        // A channel shuffle of bytes: many matrices of two rows.
        check(|i| (i * 7) as u8, (784, 2, 58));
        check(|i| (i * 131 + i / 1000 * 7) as u8, (1, 48, 37));
    }

    /// The 8 × 8 word transposes, which other CPUs run for whole tiles of bytes.
    #[test]
    fn byte_word_transposes_match_the_definition() {
        let (ss, ds) = (11, 13);
        let src: Vec<u8> = (0..7 * ss + 8).map(|i| (i * 37 % 251) as u8).collect();
        let mut dst = vec![0u8; 7 * ds + 8];
        assert!(transpose_bytes_8x8(&src, ss, &mut dst, ds));
        for r in 0..8 {
            for c in 0..8 {
                assert_eq!(dst[c * ds + r], src[r * ss + c]);
            }
        }
        assert!(!transpose_bytes_8x8(&src[1..], ss, &mut dst, ds));
    }
}
