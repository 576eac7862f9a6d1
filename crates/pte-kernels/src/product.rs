//! Matrix products `dst = beta·dst + alpha·(lhs × rhs)` on strided views, for every
//! numeric element type: float32 on `pte-compute`'s packed GEMM (SIMD micro-kernels,
//! the method's thread pool, packing buffers in the caller's scratch memory), every
//! other type in one generic blocked loop that accumulates in the type's [`Elem::Acc`]
//! (float32 for float16 and bfloat16, wrapping `i64` for integers, as PyTorch).
//!
//! Operands are strided views ([`Mat`], [`MatMut`]), so a transposed operand, such as
//! the weight of `linear`, is read in place, never copied.

use pte_compute::{Bias, Epilogue, Gemm, Lhs, Rhs, ThreadPool};
use pte_runtime::{KernelError, KernelResult};

use crate::num::{Elem, Ring};
use crate::util::compute_error;

/// Checks that a `rows`×`cols` view with strides `rs`, `cs` stays inside `len` elements.
fn check_view(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> KernelResult {
    let last = if rows == 0 || cols == 0 {
        Some(0)
    } else {
        (rows - 1)
            .checked_mul(rs)
            .zip((cols - 1).checked_mul(cs))
            .and_then(|(a, b)| a.checked_add(b))
            .filter(|&l| l < len)
    };
    match last {
        Some(_) => Ok(()),
        None => Err(KernelError::invalid(format!(
            "a {rows}x{cols} matrix with strides ({rs}, {cs}) does not fit in {len} elements"
        ))),
    }
}

/// A read-only strided matrix: element (i, j) is `data[i * rs + j * cs]`, always in bounds.
#[derive(Clone, Copy)]
pub struct Mat<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T: Copy + Default> Mat<'a, T> {
    /// A view with explicit strides, checked against `data`.
    pub fn new(
        data: &'a [T],
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
    ) -> KernelResult<Self> {
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
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> KernelResult<Self> {
        Self::new(data, rows, cols, cols, 1)
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Element (i, j) (views are checked when made, so present for i, j in range).
    fn at(&self, i: usize, j: usize) -> T {
        self.data
            .get(i * self.rs + j * self.cs)
            .copied()
            .unwrap_or_default()
    }
}

/// A writable strided matrix; distinct (i, j) always name distinct elements.
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T: Copy> MatMut<'a, T> {
    /// A view with explicit strides, checked against `data` and for overlapping elements.
    pub fn new(
        data: &'a mut [T],
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
    ) -> KernelResult<Self> {
        check_view(data.len(), rows, cols, rs, cs)?;
        // Injective when the inner stride is non-zero and the outer one steps over a
        // whole inner line (a dimension of extent 1 has no stride to speak of).
        let line = |inner: usize, extent: usize, outer: usize, outer_extent: usize| {
            (extent == 1 || inner >= 1)
                && (outer_extent == 1
                    || extent.checked_mul(inner.max(1)).is_some_and(|l| outer >= l))
        };
        let empty = rows == 0 || cols == 0;
        if !(empty || line(cs, cols, rs, rows) || line(rs, rows, cs, cols)) {
            return Err(KernelError::invalid(format!(
                "output matrix strides ({rs}, {cs}) overlap for a {rows}x{cols} matrix"
            )));
        }
        Ok(Self {
            data,
            rows,
            cols,
            rs,
            cs,
        })
    }

    /// A row-major view of the first `rows * cols` elements.
    pub fn row_major(data: &'a mut [T], rows: usize, cols: usize) -> KernelResult<Self> {
        Self::new(data, rows, cols, cols, 1)
    }

    /// Element (i, j), mutably.
    fn at_mut(&mut self, i: usize, j: usize) -> Option<&mut T> {
        self.data.get_mut(i * self.rs + j * self.cs)
    }
}

fn check_product<T: Copy + Default>(
    dst: &MatMut<'_, T>,
    lhs: &Mat<'_, T>,
    rhs: &Mat<'_, T>,
) -> KernelResult {
    if lhs.rows != dst.rows || rhs.cols != dst.cols || lhs.cols != rhs.rows {
        return Err(KernelError::invalid(format!(
            "cannot multiply {}x{} by {}x{} into {}x{}",
            lhs.rows, lhs.cols, rhs.rows, rhs.cols, dst.rows, dst.cols
        )));
    }
    Ok(())
}

/// How a product combines with what `dst` holds: `dst = beta·dst + alpha·(lhs × rhs)`,
/// with `beta` None meaning `dst` is not read (NaN there does not leak).
#[derive(Clone, Copy, Debug)]
pub struct Scale<T> {
    pub beta: Option<T>,
    pub alpha: T,
}

/// The product engine of one kernel call: the pool to run on and `pte-compute`'s GEMM.
pub struct Products<'p> {
    pool: &'p ThreadPool,
    gemm: Gemm,
}

impl<'p> Products<'p> {
    pub fn new(pool: &'p ThreadPool) -> Self {
        Self {
            pool,
            gemm: Gemm::new(),
        }
    }
}

/// Element types with a matrix product.
pub trait Product: Elem + Send + Sync {
    /// Scratch (f32 elements) a `m × n × k` product needs; `scaled` when `alpha` is not
    /// 1 or `beta` is neither None nor 1.
    fn scratch_len(
        e: &Products<'_>,
        m: usize,
        n: usize,
        k: usize,
        scaled: bool,
    ) -> KernelResult<usize>;

    /// `dst = beta·dst + alpha·(lhs × rhs)` with at least [`Product::scratch_len`]
    /// elements of `scratch`.
    fn product(
        e: &Products<'_>,
        dst: MatMut<'_, Self>,
        lhs: Mat<'_, Self>,
        rhs: Mat<'_, Self>,
        scale: Scale<Self>,
        scratch: &mut [f32],
    ) -> KernelResult;
}

/// Output columns the generic product accumulates at once along a row.
const LANES: usize = 64;

/// The generic product: each output row a block of [`LANES`] columns at a time,
/// accumulating scaled rows of `rhs` in `T::Acc`.
fn generic_product<T: Elem>(
    mut dst: MatMut<'_, T>,
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    scale: Scale<T>,
) -> KernelResult {
    check_product(&dst, &lhs, &rhs)?;
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    let alpha = scale.alpha.acc();
    let beta = scale.beta.map(T::acc);
    for i in 0..m {
        for j0 in (0..n).step_by(LANES) {
            let width = LANES.min(n - j0);
            let mut acc = [<T::Acc as Ring>::ZERO; LANES];
            for p in 0..k {
                let a = lhs.at(i, p).acc();
                for (jj, c) in acc.iter_mut().take(width).enumerate() {
                    *c = c.add(a.mul(rhs.at(p, j0 + jj).acc()));
                }
            }
            for (jj, &sum) in acc.iter().take(width).enumerate() {
                let d = dst.at_mut(i, j0 + jj).ok_or_else(crate::util::oob)?;
                let v = match beta {
                    Some(b) => b.mul(d.acc()).add(alpha.mul(sum)),
                    None => alpha.mul(sum),
                };
                *d = T::of_acc(v);
            }
        }
    }
    Ok(())
}

macro_rules! generic {
    ($($t:ty),*) => {$(
        impl Product for $t {
            fn scratch_len(_: &Products<'_>, _: usize, _: usize, _: usize, _: bool) -> KernelResult<usize> {
                Ok(0)
            }
            fn product(
                _: &Products<'_>,
                dst: MatMut<'_, Self>,
                lhs: Mat<'_, Self>,
                rhs: Mat<'_, Self>,
                scale: Scale<Self>,
                _: &mut [f32],
            ) -> KernelResult {
                generic_product(dst, lhs, rhs, scale)
            }
        }
    )*};
}
generic!(
    f64,
    half::f16,
    half::bf16,
    u8,
    i8,
    i16,
    i32,
    i64,
    u16,
    u32,
    u64
);

/// True unless the scale is `dst = lhs × rhs` or `dst += lhs × rhs`.
fn is_scaled(s: Scale<f32>) -> bool {
    s.alpha != 1.0 || s.beta.is_some_and(|b| b != 1.0)
}

impl Product for f32 {
    fn scratch_len(
        e: &Products<'_>,
        m: usize,
        n: usize,
        k: usize,
        scaled: bool,
    ) -> KernelResult<usize> {
        let gemm = e
            .gemm
            .scratch_len(m, n, k, false, false, e.pool.threads())
            .map_err(compute_error)?;
        let tmp = if scaled { m.saturating_mul(n) } else { 0 };
        gemm.checked_add(tmp)
            .ok_or_else(|| KernelError::invalid("matrix product scratch overflows"))
    }

    fn product(
        e: &Products<'_>,
        dst: MatMut<'_, Self>,
        lhs: Mat<'_, Self>,
        rhs: Mat<'_, Self>,
        scale: Scale<Self>,
        scratch: &mut [f32],
    ) -> KernelResult {
        check_product(&dst, &lhs, &rhs)?;
        let (m, n) = (dst.rows, dst.cols);
        let a = pte_compute::MatRef::new(lhs.data, lhs.rows, lhs.cols, lhs.rs, lhs.cs);
        let b = pte_compute::MatRef::new(rhs.data, rhs.rows, rhs.cols, rhs.rs, rhs.cs);
        let (a, b) = (a.map_err(compute_error)?, b.map_err(compute_error)?);
        let run = |c: pte_compute::MatMut<'_>, accumulate: bool, scratch: &mut [f32]| {
            let epilogue = Epilogue {
                accumulate,
                bias: Bias::None,
                activation: pte_compute::Activation::default(),
            };
            e.gemm
                .run(e.pool, c, Lhs::Mat(a), Rhs::Mat(b), &epilogue, scratch)
                .map_err(compute_error)
        };
        if !is_scaled(scale) {
            let c = pte_compute::MatMut::new(dst.data, m, n, dst.rs, dst.cs);
            return run(c.map_err(compute_error)?, scale.beta.is_some(), scratch);
        }
        // General scales: the plain product into scratch, then combined.
        let (tmp, rest) = scratch
            .split_at_mut_checked(m * n)
            .ok_or_else(|| KernelError::Failed("matrix product scratch is too small".into()))?;
        run(
            pte_compute::MatMut::row_major(tmp, m, n).map_err(compute_error)?,
            false,
            rest,
        )?;
        let mut dst = dst;
        for (i, row) in tmp.chunks_exact(n.max(1)).enumerate() {
            for (j, &p) in row.iter().enumerate() {
                let d = dst.at_mut(i, j).ok_or_else(crate::util::oob)?;
                *d = match scale.beta {
                    Some(b) => b * *d + scale.alpha * p,
                    None => scale.alpha * p,
                };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        (0..m * n)
            .map(|idx| {
                (0..k)
                    .map(|p| a[idx / n * k + p] * b[p * n + idx % n])
                    .sum()
            })
            .collect()
    }

    fn run<T: Product>(
        dst: MatMut<'_, T>,
        lhs: Mat<'_, T>,
        rhs: Mat<'_, T>,
        scale: Scale<T>,
    ) -> KernelResult {
        let pool = ThreadPool::new(2).unwrap();
        let e = Products::new(&pool);
        let len = T::scratch_len(&e, dst.rows, dst.cols, lhs.cols, true).unwrap();
        T::product(&e, dst, lhs, rhs, scale, &mut vec![0.0; len])
    }

    #[test]
    fn float_products_with_strides_and_scales() {
        for (m, k, n) in [(5, 7, 3), (9, 5, 19), (1, 40, 2), (48, 48, 48)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let expect = reference(&wide(&a), &wide(&b), m, k, n);
            // NaN in the destination must not leak when it is not read.
            let mut d = vec![f32::NAN; m * n];
            let rhs = Mat::row_major(&bt, n, k).unwrap().t();
            let lhs = Mat::row_major(&a, m, k).unwrap();
            let plain = Scale {
                beta: None,
                alpha: 1.0,
            };
            run(MatMut::row_major(&mut d, m, n).unwrap(), lhs, rhs, plain).unwrap();
            for (x, y) in d.iter().zip(&expect) {
                assert!((f64::from(*x) - y).abs() < 1e-4, "{x} vs {y}");
            }
            // dst = 0.5·dst + 2·a·b, in f32 and in the generic f64 loop.
            let scaled = Scale {
                beta: Some(0.5),
                alpha: 2.0,
            };
            run(MatMut::row_major(&mut d, m, n).unwrap(), lhs, rhs, scaled).unwrap();
            for (x, y) in d.iter().zip(&expect) {
                assert!((f64::from(*x) - 2.5 * y).abs() < 1e-3, "{x} vs {y}");
            }
            let (a64, bt64) = (wide(&a), wide(&bt));
            let mut d64 = vec![1.0; m * n];
            let scaled = Scale {
                beta: Some(0.5),
                alpha: 2.0,
            };
            run(
                MatMut::row_major(&mut d64, m, n).unwrap(),
                Mat::row_major(&a64, m, k).unwrap(),
                Mat::row_major(&bt64, n, k).unwrap().t(),
                scaled,
            )
            .unwrap();
            for (x, y) in d64.iter().zip(&expect) {
                assert!((x - (0.5 + 2.0 * y)).abs() < 1e-9, "{x} vs {y}");
            }
        }
    }

    #[test]
    fn integer_products_wrap() {
        let (m, k, n) = (3, 4, 2);
        let a: Vec<i8> = (0..m * k).map(|i| (i as i16 * 20 - 50) as i8).collect();
        let b: Vec<i8> = (0..k * n).map(|i| (60 - i as i16 * 17) as i8).collect();
        let mut d = vec![0i8; m * n];
        let scale = Scale {
            beta: None,
            alpha: 1,
        };
        run(
            MatMut::row_major(&mut d, m, n).unwrap(),
            Mat::row_major(&a, m, k).unwrap(),
            Mat::row_major(&b, k, n).unwrap(),
            scale,
        )
        .unwrap();
        let fi = |v: &[i8]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let want: Vec<i8> = reference(&fi(&a), &fi(&b), m, k, n)
            .iter()
            .map(|&v| v as i64 as i8)
            .collect();
        assert_eq!(d, want);
    }

    #[test]
    fn views_are_checked() {
        let v = [0f32; 6];
        assert!(Mat::new(&v, 2, 3, 3, 1).is_ok());
        assert!(Mat::new(&v, 2, 4, 3, 1).is_err());
        assert!(Mat::new(&v, 0, 100, 1000, 1).is_ok());
        let mut w = [0f32; 6];
        assert!(MatMut::new(&mut w, 2, 3, 1, 1).is_err());
        assert!(MatMut::new(&mut w, 2, 3, 1, 2).is_ok());
        assert!(MatMut::new(&mut w, 1, 3, 0, 1).is_ok());
        assert!(MatMut::new(&mut w, 4, 0, 0, 1).is_ok());
        let (a, b) = ([1f32; 6], [1f32; 6]);
        let lhs = Mat::row_major(&a, 2, 3).unwrap();
        let bad = Mat::row_major(&b, 2, 3).unwrap();
        let scale = Scale {
            beta: None,
            alpha: 1.0,
        };
        assert!(run(MatMut::row_major(&mut w, 2, 3).unwrap(), lhs, bad, scale).is_err());
    }
}
