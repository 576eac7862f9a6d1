//! The portable GEMM micro-kernel: a 4×16 register tile in plain Rust, which the
//! compiler vectorizes for the build's baseline target (SSE2 on x86-64).

use super::RawPost;

pub(crate) const MR: usize = 4;
pub(crate) const NR: usize = 16;

/// # Safety
/// `a` holds `kc * MR` values, `b` `kc * NR`, `c` the tile `(i, j) -> c[i * rs + j]`,
/// `i < R`, `j < NR`; non-null `post` biases hold R or NR values.
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    rs: usize,
    accumulate: bool,
    post: RawPost,
) {
    // SAFETY: the caller's contract covers exactly these lengths.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, kc * MR),
            std::slice::from_raw_parts(b, kc * NR),
        )
    };
    let mut acc = [[0f32; NR]; R];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for (row, &x) in acc.iter_mut().zip(ap) {
            for (s, &y) in row.iter_mut().zip(bp) {
                *s += x * y;
            }
        }
    }
    // SAFETY: non-null biases hold R (rows) or NR (columns) values.
    let (row_bias, col_bias) = unsafe {
        (
            (!post.rows.is_null()).then(|| std::slice::from_raw_parts(post.rows, R)),
            (!post.cols.is_null()).then(|| std::slice::from_raw_parts(post.cols, NR)),
        )
    };
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i < R of the tile, NR elements.
        let out = unsafe { std::slice::from_raw_parts_mut(c.add(i * rs), NR) };
        let rb = row_bias.and_then(|b| b.get(i)).copied().unwrap_or(0.0);
        for (j, (o, &s)) in out.iter_mut().zip(row).enumerate() {
            let mut x = if accumulate { *o + s } else { s };
            if post.on {
                x += rb + col_bias.and_then(|b| b.get(j)).copied().unwrap_or(0.0);
                x = crate::elementwise::clamp(x, post.min, post.max);
            }
            *o = x;
        }
    }
}

/// # Safety
/// As [`tile`], with `1 <= rows <= MR`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn kernel(
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
            1 => tile::<1>(kc, a, b, c, rs, accumulate, post),
            2 => tile::<2>(kc, a, b, c, rs, accumulate, post),
            3 => tile::<3>(kc, a, b, c, rs, accumulate, post),
            _ => tile::<MR>(kc, a, b, c, rs, accumulate, post),
        }
    }
}
