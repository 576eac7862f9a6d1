//! The AArch64 NEON GEMM micro-kernel: an 8×8 tile in 16 accumulator registers.
//! Compiled and type-checked for `aarch64-unknown-linux-gnu`; not run on the x86-64
//! development machine.

use std::arch::aarch64::*;

use super::RawPost;

pub(crate) const MR: usize = 8;
pub(crate) const NR: usize = 8;

/// # Safety
/// NEON present; `a` holds `kc * MR` values, `b` `kc * NR`, `c` the tile
/// `(i, j) -> c[i * rs + j]`, `i < R`, `j < NR`.
#[target_feature(enable = "neon")]
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
    let mut acc = [[vdupq_n_f32(0.0); 2]; R];
    for p in 0..kc {
        // SAFETY: p < kc: reads inside the panels.
        unsafe {
            let b0 = vld1q_f32(b.add(p * NR));
            let b1 = vld1q_f32(b.add(p * NR + 4));
            let ap = a.add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = vdupq_n_f32(*ap.add(i));
                row[0] = vfmaq_f32(row[0], av, b0);
                row[1] = vfmaq_f32(row[1], av, b1);
            }
        }
    }
    let (lo, hi) = (vdupq_n_f32(post.min), vdupq_n_f32(post.max));
    for (i, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: inside the tile; non-null biases hold R or NR values.
            unsafe {
                let cp = c.add(i * rs + v * 4);
                let mut x = if accumulate {
                    vaddq_f32(x, vld1q_f32(cp))
                } else {
                    x
                };
                if post.on {
                    if !post.rows.is_null() {
                        x = vaddq_f32(x, vdupq_n_f32(*post.rows.add(i)));
                    }
                    if !post.cols.is_null() {
                        x = vaddq_f32(x, vld1q_f32(post.cols.add(v * 4)));
                    }
                    // NEON's max and min return NaN if either input is NaN.
                    x = vminq_f32(vmaxq_f32(x, lo), hi);
                }
                vst1q_f32(cp, x);
            }
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
            4 => tile::<4>(kc, a, b, c, rs, accumulate, post),
            5 => tile::<5>(kc, a, b, c, rs, accumulate, post),
            6 => tile::<6>(kc, a, b, c, rs, accumulate, post),
            7 => tile::<7>(kc, a, b, c, rs, accumulate, post),
            _ => tile::<MR>(kc, a, b, c, rs, accumulate, post),
        }
    }
}
