//! Shared kernel machinery: element conversions, dtype dispatch, type promotion,
//! broadcasting, and the working memory that keeps steady-state execution free of heap
//! allocations ([`Scratch`] and [`Stateful`]).

use half::{bf16, f16};
use pte_runtime::{Args, Buffer, DType, Dims, Element, Kernel, KernelError, KernelResult};
use pte_runtime::{PreparedKernel, Scalar};

/// Element types kernels compute on, with conversions through `f64` and `i64`.
pub trait Elem: Element + Copy + PartialOrd + Default {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
    /// True for floating-point types.
    const FLOAT: bool;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_i64(self) -> i64 { self as i64 }
            fn from_i64(v: i64) -> Self { v as $t }
            const FLOAT: bool = false;
        }
    )*};
}
int_elem!(u8, i8, i16, i32, i64, u16, u32, u64);

impl Elem for f32 {
    fn to_f64(self) -> f64 {
        self.into()
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    const FLOAT: bool = true;
}

impl Elem for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    const FLOAT: bool = true;
}

macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn to_f64(self) -> f64 { self.to_f64() }
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn to_i64(self) -> i64 { self.to_f64() as i64 }
            fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
            const FLOAT: bool = true;
        }
    )*};
}
half_elem!(f16, bf16);

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

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`, for every computable dtype
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

/// Category order used by type promotion: bool < integer < float.
fn category(d: DType) -> u8 {
    if d == DType::Bool {
        0
    } else if d.is_float() {
        2
    } else {
        1
    }
}

/// PyTorch's promotion of two tensor dtypes (`torch.promote_types`).
pub fn promote(a: DType, b: DType) -> KernelResult<DType> {
    use DType::*;
    if a == b {
        return Ok(a);
    }
    let (ca, cb) = (category(a), category(b));
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

/// The dtype of `tensor op scalar` in PyTorch: the scalar only matters when it is of a
/// higher category (an int tensor with a float scalar gives float32).
pub fn promote_scalar(tensor: DType, scalar: Scalar) -> DType {
    let s = scalar.dtype();
    if category(s) > category(tensor) {
        match s {
            DType::F64 => DType::F32,
            DType::I64 => DType::I64,
            other => other,
        }
    } else {
        tensor
    }
}

/// The broadcast shape of two shapes (aligned at the trailing dimension).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> KernelResult<Dims> {
    let rank = a.len().max(b.len());
    let mut out: Dims = smallvec::smallvec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(KernelError::invalid(format!(
                "shapes {a:?} and {b:?} cannot be broadcast together"
            )));
        };
    }
    Ok(out)
}

/// Strides (in elements) for reading a contiguous tensor of shape `sizes` as if it had
/// the broadcast shape `out`: 0 along broadcast dimensions.
pub fn broadcast_strides(sizes: &[usize], out: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; out.len()];
    let mut step = 1;
    for i in (0..sizes.len()).rev() {
        let o = i + out.len() - sizes.len();
        strides[o] = if sizes[i] == 1 { 0 } else { step };
        step *= sizes[i];
    }
    strides
}

/// Calls `f(out_index, offsets)` for every element of `out` in row-major order, where
/// `offsets[k]` is the element offset into input `k` read through `strides[k]`.
pub fn for_each_broadcast<const N: usize>(
    out: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut(usize, [usize; N]),
) {
    let numel: usize = out.iter().product();
    if numel == 0 {
        return;
    }
    let rank = out.len();
    let mut index: Dims = smallvec::smallvec![0; rank];
    let mut offsets = [0usize; N];
    for i in 0..numel {
        f(i, offsets);
        // Advance the multi-index, updating offsets incrementally.
        let mut d = rank;
        while d > 0 {
            d -= 1;
            index[d] += 1;
            for k in 0..N {
                offsets[k] += strides[k][d];
            }
            if index[d] < out[d] {
                break;
            }
            for k in 0..N {
                offsets[k] -= strides[k][d] * out[d];
            }
            index[d] = 0;
        }
    }
}

/// Converts a slice between element types, through `f64` for floats and `i64` for
/// integers (bools become 0/1; floats to bool is "non-zero").
pub fn convert<S: Elem, D: Elem>(src: &[S], dst: &mut [D], dst_is_bool: bool) {
    if dst_is_bool {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::from_i64(i64::from(s.to_f64() != 0.0));
        }
    } else if S::FLOAT || D::FLOAT {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::from_f64(s.to_f64());
        }
    } else {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = D::from_i64(s.to_i64());
        }
    }
}

/// Product of `sizes[range]`.
pub fn prod(sizes: &[usize]) -> usize {
    sizes.iter().product()
}

/// Converts an `i64` size argument to `usize`, rejecting negatives.
pub fn to_size(v: i64, what: &str) -> KernelResult<usize> {
    usize::try_from(v)
        .map_err(|_| KernelError::invalid(format!("{what} must not be negative, got {v}")))
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
    let mut sizes: Dims = requested.iter().map(|&s| s.max(0) as usize).collect();
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(KernelError::invalid(format!(
                "cannot infer a size for {requested:?} from {numel} elements"
            )));
        }
        sizes[i] = numel / known;
    } else if known != numel {
        return Err(KernelError::invalid(format!(
            "shape {requested:?} does not hold {numel} elements"
        )));
    }
    Ok(sizes)
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

fn too_large() -> KernelError {
    KernelError::invalid("working memory size overflows")
}

impl<'a> Scratch<'a> {
    /// Room for pieces of `(element size in bytes, length)`.
    pub fn new(buf: &'a mut Buffer, pieces: &[(usize, usize)]) -> KernelResult<Self> {
        let total = pieces.iter().try_fold(0usize, |acc, &(size, len)| {
            let bytes = size.checked_mul(len)?;
            acc.checked_add(bytes.div_ceil(16))
        });
        let words = total.ok_or_else(too_large)?;
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
        Ok(&mut typed[..len])
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
        assert_eq!(promote_scalar(I64, Scalar::Double(1.5)), F32);
        assert_eq!(promote_scalar(F16, Scalar::Double(1.5)), F16);
        assert_eq!(promote_scalar(Bool, Scalar::Int(2)), I64);
        assert_eq!(promote_scalar(I32, Scalar::Int(2)), I32);
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
}
