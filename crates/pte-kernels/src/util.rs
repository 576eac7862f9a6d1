//! Shared kernel machinery: dtype dispatch, type promotion, broadcasting, dims and sizes
//! as PyTorch reads them, checked slice access, splitting work over the method's thread
//! pool, and the working memory that keeps steady-state execution free of heap
//! allocations ([`Scratch`] and [`Stateful`]).

use pte_runtime::{normalize_dim, Args, Buffer, DType, Dims, Kernel, KernelError, KernelResult};
use pte_runtime::{PreparedKernel, Scalar, TensorInfo};
use smallvec::SmallVec;

use crate::num::Elem;

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`, among the listed
/// `DType variant => type` pairs; `$other` is evaluated for any other dtype.
#[macro_export]
macro_rules! dispatch_types {
    ($dtype:expr, $T:ident => $body:expr, $other:expr, [$($($variant:ident)|+ => $ty:ty),+]) => {
        match $dtype {
            $($(pte_runtime::DType::$variant)|+ => {
                type $T = $ty;
                $body
            })+
            _ => $other,
        }
    };
}

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`, for every real dtype
/// (bool as `u8`). `$other` is evaluated for dtypes kernels do not compute on.
#[macro_export]
macro_rules! dispatch_all {
    ($dtype:expr, $T:ident => $body:expr, $other:expr) => {
        $crate::dispatch_types!($dtype, $T => $body, $other, [
            F32 => f32, F64 => f64, F16 => half::f16, BF16 => half::bf16, I64 => i64,
            I32 => i32, I16 => i16, I8 => i8, U8 | Bool => u8, U16 => u16, U32 => u32,
            U64 => u64
        ])
    };
}

/// Like [`dispatch_all!`], for floating-point dtypes only.
#[macro_export]
macro_rules! dispatch_float {
    ($dtype:expr, $T:ident => $body:expr, $other:expr) => {
        $crate::dispatch_types!($dtype, $T => $body, $other, [
            F32 => f32, F64 => f64, F16 => half::f16, BF16 => half::bf16
        ])
    };
}

/// Like [`dispatch_all!`], for integer dtypes and bool (as `u8`) only.
#[macro_export]
macro_rules! dispatch_int {
    ($dtype:expr, $T:ident => $body:expr, $other:expr) => {
        $crate::dispatch_types!($dtype, $T => $body, $other, [
            I64 => i64, I32 => i32, I16 => i16, I8 => i8, U8 | Bool => u8, U16 => u16,
            U32 => u32, U64 => u64
        ])
    };
}

/// An index a kernel computed itself fell outside a slice: a bug in the kernel, reported
/// as an error rather than a panic.
pub fn oob() -> KernelError {
    KernelError::Failed("internal error: a kernel index is out of range".into())
}

/// Checked slice access returning [`oob`] errors.
pub trait Checked<T> {
    fn at(&self, i: usize) -> KernelResult<&T>;
    fn at_mut(&mut self, i: usize) -> KernelResult<&mut T>;
    /// Elements `start..start + len`.
    fn span(&self, start: usize, len: usize) -> KernelResult<&[T]>;
}

impl<T> Checked<T> for [T] {
    fn at(&self, i: usize) -> KernelResult<&T> {
        self.get(i).ok_or_else(oob)
    }
    fn at_mut(&mut self, i: usize) -> KernelResult<&mut T> {
        self.get_mut(i).ok_or_else(oob)
    }
    fn span(&self, start: usize, len: usize) -> KernelResult<&[T]> {
        let end = start.checked_add(len).ok_or_else(oob)?;
        self.get(start..end).ok_or_else(oob)
    }
}

/// Category order used by type promotion: bool < integer < float < complex.
fn category(d: DType) -> u8 {
    if d == DType::Bool {
        0
    } else if d.is_complex() {
        3
    } else if d.is_float() {
        2
    } else {
        1
    }
}

/// The real dtype of a complex one's parts.
pub fn complex_part(d: DType) -> DType {
    match d {
        DType::C32 => DType::F16,
        DType::C64 => DType::F32,
        DType::C128 => DType::F64,
        other => other,
    }
}

/// The complex dtype whose parts are `d`.
fn complex_of(d: DType) -> KernelResult<DType> {
    match d {
        DType::F16 => Ok(DType::C32),
        DType::F32 | DType::BF16 => Ok(DType::C64),
        DType::F64 => Ok(DType::C128),
        other => Err(KernelError::dtypes(&[other])),
    }
}

/// PyTorch's promotion of two tensor dtypes (`torch.promote_types`).
pub fn promote(a: DType, b: DType) -> KernelResult<DType> {
    use DType::*;
    if a == b {
        return Ok(a);
    }
    let (ca, cb) = (category(a), category(b));
    if ca == 3 || cb == 3 {
        // Complex: the wider of the parts, promoting a real operand's type.
        let part = promote(complex_part(a), complex_part(b))?;
        return complex_of(if part.is_float() { part } else { F32 });
    }
    if ca != cb {
        return Ok(if ca > cb { a } else { b });
    }
    Ok(match (a, b) {
        (F16, BF16) | (BF16, F16) => F32,
        (x, y) if x.is_float() => {
            if x.size() >= y.size() {
                x
            } else {
                y
            }
        }
        // Integers: unsigned u8 with a signed type needs a wider signed type.
        (U8, I8) | (I8, U8) => I16,
        (U8, y) | (y, U8) if matches!(y, I16 | I32 | I64) => y,
        (x, y) if matches!(x, I8 | I16 | I32 | I64) && matches!(y, I8 | I16 | I32 | I64) => {
            if x.size() >= y.size() {
                x
            } else {
                y
            }
        }
        _ => return Err(KernelError::dtypes(&[a, b])),
    })
}

/// The broadcast shape of two shapes (aligned at the trailing dimension).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> KernelResult<Dims> {
    let rank = a.len().max(b.len());
    let padded = |s: &[usize], i: usize| {
        (i + s.len())
            .checked_sub(rank)
            .and_then(|j| s.get(j).copied())
            .unwrap_or(1)
    };
    (0..rank)
        .map(|i| match (padded(a, i), padded(b, i)) {
            (da, db) if da == db || db == 1 => Ok(da),
            (1, db) => Ok(db),
            _ => Err(KernelError::invalid(format!(
                "shapes {a:?} and {b:?} cannot be broadcast together"
            ))),
        })
        .collect()
}

/// Strides (in elements) for reading a contiguous tensor of shape `sizes` as if it had
/// the broadcast shape `out`: 0 along broadcast dimensions and new leading ones.
pub fn broadcast_strides(sizes: &[usize], out: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; out.len()];
    let mut step = 1usize;
    for (s, &n) in strides.iter_mut().rev().zip(sizes.iter().rev()) {
        *s = if n == 1 { 0 } else { step };
        step = step.saturating_mul(n);
    }
    strides
}

/// Calls `f(out_index, offsets)` for every element of `out` in row-major order, where
/// `offsets[k]` is the element offset into input `k` read through `strides[k]` (one
/// stride per dim of `out`).
pub fn for_each_broadcast<const N: usize>(
    out: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut(usize, [usize; N]),
) {
    let numel: usize = out.iter().product();
    if numel == 0 {
        return;
    }
    let stride = |k: &[usize], d: usize| k.get(d).copied().unwrap_or(0);
    let mut index: Dims = smallvec::smallvec![0; out.len()];
    let mut offsets = [0usize; N];
    for i in 0..numel {
        f(i, offsets);
        // Advance the multi-index, updating offsets incrementally.
        for (d, (idx, &n)) in index.iter_mut().zip(out).enumerate().rev() {
            *idx += 1;
            for (o, s) in offsets.iter_mut().zip(&strides) {
                *o = o.wrapping_add(stride(s, d));
            }
            if *idx < n {
                break;
            }
            for (o, s) in offsets.iter_mut().zip(&strides) {
                *o = o.wrapping_sub(stride(s, d).wrapping_mul(n));
            }
            *idx = 0;
        }
    }
}

/// Converts a slice between element types as PyTorch's `Tensor.to` does (bools become
/// 0/1; anything to bool is "non-zero").
pub fn convert<S: Elem, D: Elem>(src: &[S], dst: &mut [D], dst_is_bool: bool) {
    if dst_is_bool {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::from_i64(i64::from(s != S::default()));
        }
    } else if S::FLOAT {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::from_f64(s.to_f64());
        }
    } else {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::from_i64(s.to_i64());
        }
    }
}

/// A scalar as an element of `T` (`is_bool`: as 0/1 for a bool tensor).
pub fn scalar_as<T: Elem>(v: Scalar, is_bool: bool) -> T {
    match v {
        _ if is_bool => T::from_i64(i64::from(v.to_bool())),
        Scalar::Double(d) => T::from_f64(d),
        Scalar::Int(i) => T::from_i64(i),
        Scalar::Bool(b) => T::from_i64(i64::from(b)),
    }
}

/// Product of sizes.
pub fn prod(sizes: &[usize]) -> usize {
    sizes.iter().product()
}

/// Checked product of sizes.
pub fn numel_of(sizes: &[usize]) -> KernelResult<usize> {
    sizes
        .iter()
        .try_fold(1usize, |a, &s| a.checked_mul(s))
        .ok_or_else(|| KernelError::invalid(format!("shape {sizes:?} has too many elements")))
}

/// Converts an `i64` size argument to `usize`, rejecting negatives.
pub fn to_size(v: i64, what: &str) -> KernelResult<usize> {
    usize::try_from(v)
        .map_err(|_| KernelError::invalid(format!("{what} must not be negative, got {v}")))
}

/// Sizes around `dim`: (outer, dim, inner); a rank-0 tensor (or a dim past the rank) is
/// one element.
pub fn split_at_dim(sizes: &[usize], dim: usize) -> (usize, usize, usize) {
    match (sizes.get(..dim), sizes.get(dim), sizes.get(dim + 1..)) {
        (Some(outer), Some(&len), Some(inner)) => (prod(outer), len, prod(inner)),
        _ => (1, 1, 1),
    }
}

/// Resolves a requested view shape with at most one -1 against an element count.
pub fn infer_sizes(requested: &[i64], numel: usize) -> KernelResult<Dims> {
    let mut known = 1usize;
    let mut infer = None;
    for (i, &s) in requested.iter().enumerate() {
        if s == -1 {
            if infer.replace(i).is_some() {
                return Err(KernelError::invalid("only one dimension can be -1"));
            }
        } else {
            known = known
                .checked_mul(to_size(s, "size")?)
                .ok_or_else(|| KernelError::invalid("size overflows"))?;
        }
    }
    let mut sizes: Dims = requested
        .iter()
        .map(|&s| usize::try_from(s).unwrap_or(0))
        .collect();
    match infer.and_then(|i| sizes.get_mut(i)) {
        Some(slot) => {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(KernelError::invalid(format!(
                    "cannot infer a size for {requested:?} from {numel} elements"
                )));
            }
            *slot = numel / known;
        }
        None if known != numel => {
            return Err(KernelError::invalid(format!(
                "shape {requested:?} does not hold {numel} elements"
            )))
        }
        None => {}
    }
    Ok(sizes)
}

/// Errors unless two tensors share a dtype (views and moves never convert).
pub fn same_dtype(a: DType, b: DType) -> KernelResult {
    if a == b {
        Ok(())
    } else {
        Err(KernelError::dtypes(&[a, b]))
    }
}

/// A dim of a tensor that must have at least one dimension.
pub fn dim_of(info: &TensorInfo, d: i64) -> KernelResult<usize> {
    if info.rank() == 0 {
        return Err(KernelError::invalid(
            "dimension specified for a 0-dim tensor",
        ));
    }
    info.dim(d)
}

/// Normalizes a list of dims (each once) against a rank.
pub fn dim_set(dims: &[i64], rank: usize) -> KernelResult<SmallVec<[bool; 6]>> {
    let mut set: SmallVec<[bool; 6]> = smallvec::smallvec![false; rank];
    for &d in dims {
        let n = normalize_dim(d, rank)?;
        if let Some(seen) = set.get_mut(n) {
            if std::mem::replace(seen, true) {
                return Err(KernelError::invalid(format!(
                    "dim {d} appears more than once in {dims:?}"
                )));
            }
        }
    }
    Ok(set)
}

/// PyTorch's slice clamping: the first index and the length of `start:end:step` over a
/// dimension of `size`.
pub fn slice_bounds(
    size: usize,
    start: Option<i64>,
    end: Option<i64>,
    step: i64,
) -> KernelResult<(usize, usize)> {
    if step <= 0 {
        return Err(KernelError::invalid(format!(
            "slice step must be positive, got {step}"
        )));
    }
    let n = size as i128;
    let clamp = |v: Option<i64>, default: i128| {
        let v = v.map_or(default, |v| if v < 0 { v as i128 + n } else { v as i128 });
        v.clamp(0, n)
    };
    let start = clamp(start, 0);
    let end = clamp(end, n).max(start);
    let len = (end - start + step as i128 - 1) / step as i128;
    Ok((start as usize, len as usize))
}

/// A negative index wrapped once into `0..size`.
pub fn wrap_index(index: i64, size: usize, dim: usize) -> KernelResult<usize> {
    let i = if index < 0 {
        index as i128 + size as i128
    } else {
        index as i128
    };
    if i < 0 || i >= size as i128 {
        return Err(KernelError::invalid(format!(
            "index {index} is out of bounds for dimension {dim} with size {size}"
        )));
    }
    Ok(i as usize)
}

/// Work (about one unit per multiply-add) above which a kernel splits over threads.
pub const PARALLEL_WORK: usize = 1 << 19;

/// A failure of a `pte-compute` primitive.
pub fn compute_error(e: pte_compute::Error) -> KernelError {
    KernelError::Failed(e.to_string())
}

/// Calls `f(i, piece)` for each `chunk`-sized piece of `data` (the last may be shorter),
/// on the pool's threads when `work` (about one unit per multiply-add) pays for it.
pub fn for_each_chunk<T: Send>(
    pool: &pte_compute::ThreadPool,
    data: &mut [T],
    chunk: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> KernelResult {
    if chunk == 0 {
        return Ok(());
    }
    if work >= PARALLEL_WORK && data.len() > chunk {
        pool.parallel_chunks(data, chunk, &mut [0u8; 0], 0, |i, c, _| f(i, c))
            .map_err(compute_error)
    } else {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
        Ok(())
    }
}

/// Typed pieces of the method's scratch memory (`Io::scratch`), which a kernel borrows
/// once per call: declare every piece up front, then take them in order. The memory is
/// kept across calls, so once grown it is reused; its contents are whatever was left
/// there.
pub struct Scratch<'a> {
    rest: &'a mut [u128],
}

/// 16-byte words holding `len` elements of `T`.
fn words<T>(len: usize) -> Option<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .map(|b| b.div_ceil(16))
}

impl<'a> Scratch<'a> {
    /// Room for pieces of `(element size in bytes, length)`.
    pub fn new(buf: &'a mut Buffer, pieces: &[(usize, usize)]) -> KernelResult<Self> {
        let total = pieces.iter().try_fold(0usize, |acc, &(size, len)| {
            let bytes = size.checked_mul(len)?;
            acc.checked_add(bytes.div_ceil(16))
        });
        let words = total.ok_or_else(|| KernelError::invalid("working memory size overflows"))?;
        let rest = buf
            .slice_mut::<u128>(words)
            .map_err(|source| KernelError::Memory {
                what: "working memory".into(),
                source,
            })?;
        Ok(Scratch { rest })
    }

    /// A piece declaration for [`Scratch::new`]: `len` elements of `T`.
    pub fn piece<T>(len: usize) -> (usize, usize) {
        (std::mem::size_of::<T>(), len)
    }

    /// The next `len` elements of `T` (`T`'s size must divide 16 bytes).
    pub fn take<T: bytemuck::Pod>(&mut self, len: usize) -> KernelResult<&'a mut [T]> {
        let n = words::<T>(len)
            .filter(|&n| n <= self.rest.len())
            .ok_or_else(|| KernelError::Failed("a scratch piece was not declared".into()))?;
        let (head, tail) = std::mem::take(&mut self.rest).split_at_mut(n);
        self.rest = tail;
        let typed: &mut [T] = bytemuck::try_cast_slice_mut(head)
            .map_err(|e| KernelError::Failed(format!("scratch piece: {e}")))?;
        typed.get_mut(..len).ok_or_else(oob)
    }
}

/// A kernel whose call sites each keep a value of `S` from one execution to the next:
/// buffers (cleared, never shrunk) that are filled before `Args::io` can hand out
/// [`Scratch`], such as index values read from tensors.
pub struct Stateful<S>(pub fn(&mut Args<'_>, &mut S) -> KernelResult);

struct StatefulRun<S> {
    f: fn(&mut Args<'_>, &mut S) -> KernelResult,
    state: S,
}

impl<S: Default + Send + 'static> Kernel for Stateful<S> {
    fn prepare(&self, _: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        Ok(Box::new(StatefulRun {
            f: self.0,
            state: S::default(),
        }))
    }
}

impl<S: Send> PreparedKernel for StatefulRun<S> {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        (self.f)(args, &mut self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        use DType::*;
        assert_eq!(promote(I32, F32).unwrap(), F32);
        assert_eq!(promote(U8, I8).unwrap(), I16);
        assert_eq!(promote(Bool, I32).unwrap(), I32);
        assert_eq!(promote(I64, I32).unwrap(), I64);
        assert_eq!(promote(F16, BF16).unwrap(), F32);
        assert_eq!(promote(C64, F64).unwrap(), C128);
        assert_eq!(promote(C32, F32).unwrap(), C64);
        assert_eq!(promote(I64, C64).unwrap(), C64);
    }

    #[test]
    fn scratch_pieces_do_not_overlap() {
        let mut buf = pte_runtime::MemoryBudget::new(1 << 20).buffer(0).unwrap();
        let mut s = Scratch::new(
            &mut buf,
            &[Scratch::piece::<f64>(3), Scratch::piece::<u8>(5)],
        )
        .unwrap();
        let a = s.take::<f64>(3).unwrap();
        let b = s.take::<u8>(5).unwrap();
        a.fill(1.0);
        b.fill(2);
        assert_eq!((a.len(), b.len()), (3, 5));
        assert_eq!(a, [1.0; 3]);
        assert!(s.take::<u8>(1).is_err());
        assert_eq!(buf.len(), 48);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]).unwrap().as_slice(), &[3, 4]);
        assert!(broadcast_shapes(&[3], &[4]).is_err());
        let out = [2, 3];
        let sa = broadcast_strides(&[2, 1], &out);
        let sb = broadcast_strides(&[3], &out);
        let mut seen = Vec::new();
        for_each_broadcast(&out, [&sa, &sb], |i, [a, b]| seen.push((i, a, b)));
        assert_eq!(
            seen,
            vec![
                (0, 0, 0),
                (1, 0, 1),
                (2, 0, 2),
                (3, 1, 0),
                (4, 1, 1),
                (5, 1, 2)
            ]
        );
    }

    #[test]
    fn slices_clamp_like_pytorch() {
        assert_eq!(slice_bounds(5, Some(-2), None, 1).unwrap(), (3, 2));
        assert_eq!(slice_bounds(5, Some(1), Some(i64::MAX), 2).unwrap(), (1, 2));
        assert_eq!(slice_bounds(5, Some(4), Some(2), 1).unwrap(), (4, 0));
        assert_eq!(slice_bounds(5, Some(-9), Some(9), 3).unwrap(), (0, 2));
        assert!(slice_bounds(5, None, None, 0).is_err());
    }

    #[test]
    fn indices_wrap_once() {
        assert_eq!(wrap_index(-1, 4, 0).unwrap(), 3);
        assert!(wrap_index(-5, 4, 0).is_err());
        assert!(wrap_index(4, 4, 0).is_err());
    }

    #[test]
    fn dim_sets_reject_repeats() {
        assert_eq!(
            dim_set(&[0, -1], 3).unwrap().as_slice(),
            &[true, false, true]
        );
        assert!(dim_set(&[1, -2], 3).is_err());
        assert!(dim_set(&[0], 0).unwrap().is_empty());
    }
}
