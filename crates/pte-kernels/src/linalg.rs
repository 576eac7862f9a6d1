//! Matrix products: `mm`, `bmm`, `addmm` and `linear`.
//!
//! float32, float64 and float16 run on the `gemm` crate (packed SIMD microkernels, split
//! over Rayon threads once a product is large enough to pay for it). Operands are strided
//! views ([`Mat`], [`MatMut`]), so a transposed operand, such as the weight of `linear`,
//! is read in place, never copied. bfloat16 computes through float32 copies; integers use
//! a plain loop with wrapping arithmetic, as PyTorch does. `bmm` of many small matrices
//! runs the batch in parallel instead. The convolution kernels share [`Gemm`].
//!
//! Float products of fewer than 2^16 multiply-adds run in a plain loop instead (register
//! tiles of scaled rows of the right operand, or dot products, in vectorizable blocks):
//! `gemm` 0.19 allocates on every call (its packing buffers and a flag per packed block)
//! and takes no caller memory, so only the loop keeps small products free of heap
//! allocations in steady state. Larger products still allocate inside `gemm` (two small
//! buffers per call, more when split over threads), and bfloat16 ones for their float32
//! copies.

use gemm::Parallelism;
use half::{bf16, f16};
use pte_runtime::{
    Arg, Args, DType, KernelError, KernelRegistry, KernelResult, Scalar, TensorInfo,
};
use rayon::prelude::*;

use crate::nn::{Float, Real};
use crate::util::{broadcast_shapes, broadcast_strides, for_each_broadcast, Elem};

/// Multiply-adds above which a product is worth splitting over threads.
pub(crate) const PARALLEL_WORK: usize = 1 << 19;

/// Float products with fewer multiply-adds run in [`small_gemm`], which allocates
/// nothing. Measured single-threaded against `gemm` on x86-64 with AVX2: as fast up to
/// about 1000 multiply-adds, about 2.5 times slower near this bound (2 to 4 µs against
/// 1.5, the price of not allocating).
const SMALL_WORK: usize = 1 << 16;

/// Checks that a `rows`×`cols` view with strides `rs`, `cs` stays inside `len` elements
/// and that its strides fit the `isize` offsets `gemm` takes.
fn check_view(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> KernelResult {
    let strides_fit = isize::try_from(rs).is_ok() && isize::try_from(cs).is_ok();
    let last = if rows == 0 || cols == 0 {
        Some(0)
    } else {
        (rows - 1)
            .checked_mul(rs)
            .zip((cols - 1).checked_mul(cs))
            .and_then(|(a, b)| a.checked_add(b))
            .filter(|&l| l < len)
    };
    if strides_fit && last.is_some() {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "a {rows}x{cols} matrix with strides ({rs}, {cs}) does not fit in {len} elements"
        )))
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

impl<'a, T: Copy> Mat<'a, T> {
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

    fn get(&self, i: usize, j: usize) -> T {
        self.data[i * self.rs + j * self.cs]
    }

    /// A row-major copy converted to float32.
    fn to_f32(self) -> Vec<f32>
    where
        T: Elem,
    {
        (0..self.rows)
            .flat_map(|i| (0..self.cols).map(move |j| self.get(i, j).to_f64() as f32))
            .collect()
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
            (extent == 1 || inner >= 1) && (outer_extent == 1 || outer >= extent * inner.max(1))
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

    fn get(&self, i: usize, j: usize) -> T {
        self.data[i * self.rs + j * self.cs]
    }

    fn set(&mut self, i: usize, j: usize, v: T) {
        self.data[i * self.rs + j * self.cs] = v;
    }
}

fn check_product<T: Copy>(dst: &MatMut<'_, T>, lhs: &Mat<'_, T>, rhs: &Mat<'_, T>) -> KernelResult {
    if lhs.rows != dst.rows || rhs.cols != dst.cols || lhs.cols != rhs.rows {
        return Err(KernelError::invalid(format!(
            "cannot multiply {}x{} by {}x{} into {}x{}",
            lhs.rows, lhs.cols, rhs.rows, rhs.cols, dst.rows, dst.cols
        )));
    }
    Ok(())
}

fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_WORK {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    }
}

/// Element types with a matrix product.
pub trait Gemm: Elem + Send + Sync {
    /// `dst = beta·dst + alpha·(lhs × rhs)` (BLAS convention). With `beta` None, `dst`
    /// is not read, so whatever it held (NaN included) does not leak into the result.
    fn gemm(
        dst: MatMut<'_, Self>,
        lhs: Mat<'_, Self>,
        rhs: Mat<'_, Self>,
        beta: Option<Self>,
        alpha: Self,
    ) -> KernelResult;
}

/// True when a product is small enough for [`small_gemm`].
fn is_small<T>(dst: &MatMut<'_, T>, lhs: &Mat<'_, T>) -> bool {
    dst.rows.saturating_mul(dst.cols).saturating_mul(lhs.cols) < SMALL_WORK
}

/// Output columns [`small_gemm`] accumulates at once along a row.
const LANES: usize = 32;
/// The register tile of [`small_gemm`]: rows × columns of outputs accumulated together,
/// so that each loaded element serves several multiply-adds.
const TILE: (usize, usize) = (4, 8);

/// `Σ x[p]·y[p]` in eight independent lanes (which vectorize).
fn dot<T: Float>(x: &[T], y: &[T]) -> T::Acc {
    let zero = <T::Acc as Real>::ZERO;
    let mut lanes = [zero; 8];
    let (xs, ys) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail = xs.remainder().iter().zip(ys.remainder());
    for (a, b) in xs.zip(ys) {
        for ((l, p), q) in lanes.iter_mut().zip(a).zip(b) {
            *l += p.acc() * q.acc();
        }
    }
    tail.fold(lanes.iter().fold(zero, |s, &l| s + l), |s, (p, q)| {
        s + p.acc() * q.acc()
    })
}

/// [`Gemm::gemm`] in a plain loop accumulating in `T::Acc`, for small products. With the
/// right operand's rows contiguous, outputs are built from scaled runs of those rows, a
/// [`TILE`] at a time, the edges `LANES` columns of one row at a time; with the left
/// operand's rows and the right one's columns contiguous (a transposed weight), each
/// output is a dot product; any other layout is read element by element.
fn small_gemm<T: Float>(
    mut dst: MatMut<'_, T>,
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    beta: Option<T>,
    alpha: T,
) -> KernelResult {
    const MR: usize = TILE.0;
    const NR: usize = TILE.1;
    check_product(&dst, &lhs, &rhs)?;
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (alpha, beta) = (alpha.acc(), beta.map(T::acc));
    let zero = <T::Acc as Real>::ZERO;
    let finish = |dst: &mut MatMut<'_, T>, i: usize, j: usize, sum: T::Acc| {
        let v = match beta {
            Some(b) => b * dst.get(i, j).acc() + alpha * sum,
            None => alpha * sum,
        };
        dst.set(i, j, T::of_acc(v));
    };
    if rhs.cs == 1 && k > 0 {
        // Views are checked, so every run of a row of `rhs` below is in bounds.
        let run = |p: usize, j: usize, w: usize| &rhs.data[p * rhs.rs + j..][..w];
        let (m_tiled, n_tiled) = (m - m % MR, n - n % NR);
        for i in (0..m_tiled).step_by(MR) {
            for j in (0..n_tiled).step_by(NR) {
                let mut acc = [[zero; NR]; MR];
                for p in 0..k {
                    let r = run(p, j, NR);
                    let r: [T::Acc; NR] = std::array::from_fn(|l| r[l].acc());
                    for (t, row) in acc.iter_mut().enumerate() {
                        let a = lhs.get(i + t, p).acc();
                        for (c, &v) in row.iter_mut().zip(&r) {
                            *c += a * v;
                        }
                    }
                }
                for (t, row) in acc.iter().enumerate() {
                    for (l, &sum) in row.iter().enumerate() {
                        finish(&mut dst, i + t, j + l, sum);
                    }
                }
            }
        }
        // The edges: columns right of the tiles, then rows below them.
        for i in 0..m {
            let from = if i < m_tiled { n_tiled } else { 0 };
            for j in (from..n).step_by(LANES) {
                let w = LANES.min(n - j);
                let mut acc = [zero; LANES];
                for p in 0..k {
                    let a = lhs.get(i, p).acc();
                    for (c, v) in acc.iter_mut().zip(run(p, j, w)) {
                        *c += a * v.acc();
                    }
                }
                for (l, &sum) in acc[..w].iter().enumerate() {
                    finish(&mut dst, i, j + l, sum);
                }
            }
        }
    } else if lhs.cs == 1 && rhs.rs == 1 && k > 0 {
        for i in 0..m {
            let x = &lhs.data[i * lhs.rs..][..k];
            for j in 0..n {
                finish(&mut dst, i, j, dot(x, &rhs.data[j * rhs.cs..][..k]));
            }
        }
    } else {
        for i in 0..m {
            for j in 0..n {
                let sum = (0..k).fold(zero, |s, p| s + lhs.get(i, p).acc() * rhs.get(p, j).acc());
                finish(&mut dst, i, j, sum);
            }
        }
    }
    Ok(())
}

/// The types `gemm::gemm` implements (it panics on any other).
trait NativeGemm: Float {}
impl NativeGemm for f32 {}
impl NativeGemm for f64 {}
impl NativeGemm for f16 {}

/// The one call into `gemm`, with every pointer and stride checked first.
fn native_gemm<T: NativeGemm>(
    dst: MatMut<'_, T>,
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    beta: Option<T>,
    alpha: T,
) -> KernelResult {
    if is_small(&dst, &lhs) {
        return small_gemm(dst, lhs, rhs, beta, alpha);
    }
    check_product(&dst, &lhs, &rhs)?;
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    // SAFETY: `Mat::new`/`MatMut::new` checked that every offset `i * rs + j * cs` of a
    // view (i < rows, j < cols) lies inside its slice and that the strides fit `isize`;
    // `check_product` checked that the dimensions agree, so `gemm` reads `lhs` only at
    // i < m, p < k, `rhs` at p < k, j < n, and reads/writes `dst` at i < m, j < n, all
    // in bounds. `dst` is a unique borrow whose elements are pairwise distinct (checked
    // by `MatMut::new`), so the threads `gemm` spawns write disjoint elements, and it
    // cannot overlap the shared `lhs`/`rhs`. `T` is f32, f64 or half's f16 (the `f16`
    // `gemm` names), the only types `NativeGemm` admits; all strides are non-negative.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            dst.cs as isize,
            dst.rs as isize,
            beta.is_some(),
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            beta.unwrap_or_default(),
            alpha,
            false,
            false,
            false,
            parallelism(m, n, k),
        );
    }
    Ok(())
}

/// Implements [`Gemm`] for element types with the product function that serves them.
macro_rules! impl_gemm {
    ($product:ident: $($t:ty),*) => {$(
        impl Gemm for $t {
            fn gemm(dst: MatMut<'_, Self>, lhs: Mat<'_, Self>, rhs: Mat<'_, Self>, beta: Option<Self>, alpha: Self)
                -> KernelResult {
                $product(dst, lhs, rhs, beta, alpha)
            }
        }
    )*};
}
impl_gemm!(native_gemm: f32, f64, f16);

impl Gemm for bf16 {
    fn gemm(
        mut dst: MatMut<'_, Self>,
        lhs: Mat<'_, Self>,
        rhs: Mat<'_, Self>,
        beta: Option<Self>,
        alpha: Self,
    ) -> KernelResult {
        if is_small(&dst, &lhs) {
            return small_gemm(dst, lhs, rhs, beta, alpha);
        }
        check_product(&dst, &lhs, &rhs)?;
        let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
        let (l, r) = (lhs.to_f32(), rhs.to_f32());
        let mut d: Vec<f32> = (0..m)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .map(|(i, j)| {
                if beta.is_some() {
                    dst.get(i, j).to_f32()
                } else {
                    0.0
                }
            })
            .collect();
        f32::gemm(
            MatMut::row_major(&mut d, m, n)?,
            Mat::row_major(&l, m, k)?,
            Mat::row_major(&r, k, n)?,
            beta.map(bf16::to_f32),
            alpha.to_f32(),
        )?;
        for i in 0..m {
            for j in 0..n {
                dst.set(i, j, bf16::from_f32(d[i * n + j]));
            }
        }
        Ok(())
    }
}

/// Integer product in wrapping two's complement arithmetic (as PyTorch's integer `mm`).
fn integer_gemm<T: Elem>(
    mut dst: MatMut<'_, T>,
    lhs: Mat<'_, T>,
    rhs: Mat<'_, T>,
    beta: Option<T>,
    alpha: T,
) -> KernelResult {
    check_product(&dst, &lhs, &rhs)?;
    for i in 0..dst.rows {
        for j in 0..dst.cols {
            let dot = (0..lhs.cols).fold(0i64, |acc, p| {
                acc.wrapping_add(lhs.get(i, p).to_i64().wrapping_mul(rhs.get(p, j).to_i64()))
            });
            let mut v = dot.wrapping_mul(alpha.to_i64());
            if let Some(b) = beta {
                v = v.wrapping_add(b.to_i64().wrapping_mul(dst.get(i, j).to_i64()));
            }
            dst.set(i, j, T::from_i64(v));
        }
    }
    Ok(())
}

impl_gemm!(integer_gemm: u8, i8, i16, i32, i64, u16, u32, u64);

/// A scalar argument as element type `T` (truncated for integer types).
fn scalar_as<T: Elem>(s: Scalar) -> T {
    if T::FLOAT {
        T::from_f64(s.to_f64())
    } else {
        T::from_i64(s.to_i64())
    }
}

/// The common dtype of a product's tensors; products of bools are not defined.
fn common_dtype(dtypes: &[DType]) -> KernelResult<DType> {
    match dtypes.split_first() {
        Some((&d, rest)) if d != DType::Bool && rest.iter().all(|&x| x == d) => Ok(d),
        _ => Err(KernelError::dtypes(dtypes)),
    }
}

/// Runs `$body` with `$T` bound to the element type of a (non-bool) product dtype.
macro_rules! dispatch_gemm {
    ($dtype:expr, $T:ident => $body:expr) => {
        crate::dispatch_all!($dtype, $T => $body, Err(KernelError::dtypes(&[$dtype])))
    };
}

fn matrix(t: &TensorInfo, what: &str) -> KernelResult<(usize, usize)> {
    match t.sizes.as_slice() {
        &[r, c] => Ok((r, c)),
        s => Err(KernelError::invalid(format!(
            "{what} must be a matrix, got shape {s:?}"
        ))),
    }
}

fn inner_dims(k: usize, k2: usize, a: &[usize], b: &[usize]) -> KernelResult {
    if k == k2 {
        Ok(())
    } else {
        Err(KernelError::invalid(format!(
            "shapes {a:?} and {b:?} cannot be multiplied"
        )))
    }
}

/// Writes `src` (shape `src_sizes`) broadcast to `out_sizes` into `dst`.
fn broadcast_into<T: Copy>(
    dst: &mut [T],
    src: &[T],
    src_sizes: &[usize],
    out_sizes: &[usize],
) -> KernelResult {
    if broadcast_shapes(src_sizes, out_sizes)?.as_slice() != out_sizes {
        return Err(KernelError::invalid(format!(
            "bias of shape {src_sizes:?} does not broadcast to {out_sizes:?}"
        )));
    }
    let row = out_sizes.last().copied().unwrap_or(1);
    if src.len() == dst.len() {
        dst.copy_from_slice(src);
    } else if src.len() == row && src_sizes.last() == Some(&row) && row > 0 {
        for r in dst.chunks_mut(row) {
            r.copy_from_slice(src);
        }
    } else {
        let strides = broadcast_strides(src_sizes, out_sizes);
        for_each_broadcast(out_sizes, [&strides], |i, [o]| dst[i] = src[o]);
    }
    Ok(())
}

/// `mm.out(self, mat2, out)`.
fn mm(args: &mut Args<'_>) -> KernelResult {
    let (a, b) = (args.tensor(0)?, args.tensor(1)?);
    let dtype = common_dtype(&[a.dtype, b.dtype, args.tensor(2)?.dtype])?;
    let ((m, k), (k2, n)) = (matrix(&a, "self")?, matrix(&b, "mat2")?);
    inner_dims(k, k2, &a.sizes, &b.sizes)?;
    args.resize(2, &[m, n])?;
    let mut io = args.io(&[0.into(), 1.into()], &[2.into()])?;
    dispatch_gemm!(dtype, T => {
        let lhs = Mat::row_major(io.inputs[0].as_slice::<T>()?, m, k)?;
        let rhs = Mat::row_major(io.inputs[1].as_slice::<T>()?, k, n)?;
        let dst = MatMut::row_major(io.outputs[0].as_mut_slice::<T>()?, m, n)?;
        T::gemm(dst, lhs, rhs, None, T::from_i64(1))
    })
}

/// `bmm.out(self, mat2, out)`: one product per batch entry; many small products are
/// spread over threads by batch, large ones parallelize inside `gemm`.
fn bmm(args: &mut Args<'_>) -> KernelResult {
    let (a, b) = (args.tensor(0)?, args.tensor(1)?);
    let dtype = common_dtype(&[a.dtype, b.dtype, args.tensor(2)?.dtype])?;
    let (batch, m, k, n) = match (a.sizes.as_slice(), b.sizes.as_slice()) {
        (&[ba, m, k], &[bb, k2, n]) if ba == bb && k == k2 => (ba, m, k, n),
        (sa, sb) => {
            return Err(KernelError::invalid(format!(
                "bmm needs shapes [b, m, k] and [b, k, n], got {sa:?} and {sb:?}"
            )))
        }
    };
    args.resize(2, &[batch, m, n])?;
    if batch * m * n == 0 {
        return Ok(());
    }
    let mut io = args.io(&[0.into(), 1.into()], &[2.into()])?;
    dispatch_gemm!(dtype, T => {
        let (x, y) = (io.inputs[0].as_slice::<T>()?, io.inputs[1].as_slice::<T>()?);
        let out = io.outputs[0].as_mut_slice::<T>()?;
        let one = T::from_i64(1);
        let product = |(i, dst): (usize, &mut [T])| {
            let lhs = Mat::row_major(&x[i * m * k..], m, k)?;
            let rhs = Mat::row_major(&y[i * k * n..], k, n)?;
            T::gemm(MatMut::row_major(dst, m, n)?, lhs, rhs, None, one)
        };
        let work = (m * n).saturating_mul(k.max(1));
        if work < PARALLEL_WORK && batch > 1 && work.saturating_mul(batch) >= PARALLEL_WORK {
            out.par_chunks_mut(m * n).enumerate().try_for_each(product)
        } else {
            out.chunks_mut(m * n).enumerate().try_for_each(product)
        }
    })
}

/// `addmm.out(self, mat1, mat2, beta, alpha, out)`: `beta·self + alpha·(mat1 × mat2)`,
/// `self` broadcast to the product's shape and ignored when `beta` is 0.
fn addmm(args: &mut Args<'_>) -> KernelResult {
    let (bias, a, b) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let (beta, alpha) = (args.scalar(3)?, args.scalar(4)?);
    let dtype = common_dtype(&[bias.dtype, a.dtype, b.dtype, args.tensor(5)?.dtype])?;
    let ((m, k), (k2, n)) = (matrix(&a, "mat1")?, matrix(&b, "mat2")?);
    inner_dims(k, k2, &a.sizes, &b.sizes)?;
    args.resize(5, &[m, n])?;
    let mut io = args.io(&[0.into(), 1.into(), 2.into()], &[5.into()])?;
    dispatch_gemm!(dtype, T => {
        let lhs = Mat::row_major(io.inputs[1].as_slice::<T>()?, m, k)?;
        let rhs = Mat::row_major(io.inputs[2].as_slice::<T>()?, k, n)?;
        let out = io.outputs[0].as_mut_slice::<T>()?;
        let use_bias = beta.to_f64() != 0.0;
        if use_bias {
            broadcast_into(out, io.inputs[0].as_slice::<T>()?, &bias.sizes, &[m, n])?;
        }
        let beta = use_bias.then(|| scalar_as::<T>(beta));
        T::gemm(MatMut::row_major(out, m, n)?, lhs, rhs, beta, scalar_as::<T>(alpha))
    })
}

/// `linear.out(input, weight, bias?, out)`: `input × weightᵀ + bias` over the last dim of
/// `input`, the weight read transposed in place.
fn linear(args: &mut Args<'_>) -> KernelResult {
    let (x, w) = (args.tensor(0)?, args.tensor(1)?);
    let bias = args.opt_tensor(2)?;
    let bias_dtype = bias.as_ref().map_or(x.dtype, |b| b.dtype);
    let dtype = common_dtype(&[x.dtype, w.dtype, args.tensor(3)?.dtype, bias_dtype])?;
    let (n, k) = matrix(&w, "weight")?;
    let (&k2, lead) = x
        .sizes
        .split_last()
        .ok_or_else(|| KernelError::invalid("linear input must have at least one dimension"))?;
    inner_dims(k2, k, &x.sizes, &w.sizes)?;
    let m: usize = lead.iter().product();
    let mut out_sizes = x.sizes.clone();
    *out_sizes.last_mut().expect("rank checked above") = n;
    args.resize(3, &out_sizes)?;
    let reads = [Arg::At(0), Arg::At(1), Arg::At(2)];
    let mut io = args.io(&reads[..2 + usize::from(bias.is_some())], &[3.into()])?;
    dispatch_gemm!(dtype, T => {
        let lhs = Mat::row_major(io.inputs[0].as_slice::<T>()?, m, k)?;
        let rhs = Mat::row_major(io.inputs[1].as_slice::<T>()?, n, k)?.t();
        let out = io.outputs[0].as_mut_slice::<T>()?;
        let beta = match &bias {
            Some(b) => {
                broadcast_into(out, io.inputs[2].as_slice::<T>()?, &b.sizes, &out_sizes)?;
                Some(T::from_i64(1))
            }
            None => None,
        };
        T::gemm(MatMut::row_major(out, m, n)?, lhs, rhs, beta, T::from_i64(1))
    })
}

/// Registers the matrix product kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::mm.out", mm);
    r.register_fn("aten::bmm.out", bmm);
    r.register_fn("aten::addmm.out", addmm);
    r.register_fn("aten::linear.out", linear);
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

    #[test]
    fn float_product_with_strides_and_scales() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let expect = reference(
            &a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            &b.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            m,
            k,
            n,
        );
        // NaN in the destination must not leak when it is not read.
        let mut d = vec![f32::NAN; m * n];
        let rhs = Mat::row_major(&bt, n, k).unwrap().t();
        f32::gemm(
            MatMut::row_major(&mut d, m, n).unwrap(),
            Mat::row_major(&a, m, k).unwrap(),
            rhs,
            None,
            1.0,
        )
        .unwrap();
        for (x, y) in d.iter().zip(&expect) {
            assert!((f64::from(*x) - y).abs() < 1e-5, "{x} vs {y}");
        }
        // dst = 0.5·dst + 2·a·b
        let lhs = Mat::row_major(&a, m, k).unwrap();
        f32::gemm(
            MatMut::row_major(&mut d, m, n).unwrap(),
            lhs,
            rhs,
            Some(0.5),
            2.0,
        )
        .unwrap();
        for (x, y) in d.iter().zip(&expect) {
            assert!((f64::from(*x) - 2.5 * y).abs() < 1e-4, "{x} vs {y}");
        }
        // The integer path agrees, with wrapping.
        let ai: Vec<i32> = (0..m * k).map(|i| i as i32 - 10).collect();
        let bi: Vec<i32> = (0..k * n).map(|i| 3 - i as i32).collect();
        let mut di = vec![0i32; m * n];
        i32::gemm(
            MatMut::row_major(&mut di, m, n).unwrap(),
            Mat::row_major(&ai, m, k).unwrap(),
            Mat::row_major(&bi, k, n).unwrap(),
            None,
            1,
        )
        .unwrap();
        let fi = |v: &[i32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        assert_eq!(fi(&di), reference(&fi(&ai), &fi(&bi), m, k, n));
    }

    #[test]
    fn loop_and_gemm_products_agree_with_a_reference() {
        // Tiles with edges, a transposed right operand, and one product for `gemm`.
        for (m, k, n) in [(9, 5, 19), (4, 3, 8), (1, 40, 2), (48, 48, 48)] {
            let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
            let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
            let bt: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let expect = reference(&a, &b, m, k, n);
            let lhs = Mat::row_major(&a, m, k).unwrap();
            for rhs in [
                Mat::row_major(&b, k, n).unwrap(),
                Mat::row_major(&bt, n, k).unwrap().t(),
            ] {
                let mut d = vec![1.0; m * n];
                let dst = MatMut::row_major(&mut d, m, n).unwrap();
                f64::gemm(dst, lhs, rhs, Some(0.5), 2.0).unwrap();
                for (x, y) in d.iter().zip(&expect) {
                    assert!(
                        (x - (0.5 + 2.0 * y)).abs() < 1e-9,
                        "{m}x{k}x{n}: {x} vs {y}"
                    );
                }
            }
        }
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
        assert!(f32::gemm(
            MatMut::row_major(&mut w, 2, 3).unwrap(),
            lhs,
            bad,
            None,
            1.0
        )
        .is_err());
    }
}
