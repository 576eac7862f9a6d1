//! The machinery behind every data-movement kernel: a dtype-agnostic strided element copy,
//! dtype conversion of whole buffers, fills, and reading tensors of any dim order as if
//! they were contiguous.
//!
//! [`copy`] walks a shape once with a source and a destination [`Layout`] (offset and
//! strides in elements, negative strides allowed). Before walking it checks both layouts
//! against their buffers, drops size-1 dimensions and merges dimensions that are
//! contiguous in both operands, so a copy that is contiguous in its innermost dimension
//! becomes a loop of `memcpy`s. Elements move as unsigned integers of their size
//! ([`by_elem_size!`]), so one instantiation per element size serves every dtype.
//! Walks of up to [`MAX_WALK`] dimensions (twice the usual rank, for `repeat`) stay on
//! the stack; converted copies live in the method's scratch memory.
//!
//! [`Dense`] gives kernels written for the default dim order inputs and outputs of any
//! dim order: inputs in another order are gathered into scratch memory first, and
//! results for such outputs are computed in scratch and scattered afterwards.

use half::{bf16, f16};
use pte_runtime::{Arg, Args, Buffer, Charge, DType, Element, Io, KernelError, KernelResult};
use pte_runtime::{MemoryError, Scalar};
use pte_runtime::{TensorData, TensorDataMut, TensorInfo};
use smallvec::SmallVec;

use crate::num::Elem;
use crate::util::{compute_error, convert, oob, scalar_as, Scratch};
use pte_compute::ThreadPool;

/// Dimensions of a walk kept inline.
pub const MAX_WALK: usize = 16;

/// Strides in elements; negative for reversed walks.
pub type Strides = SmallVec<[isize; MAX_WALK]>;

/// The sizes of a walk.
pub type Walk = SmallVec<[usize; MAX_WALK]>;

/// A coalesced copy walk: `(size, source stride, destination stride)` per dim.
type WalkDims = SmallVec<[(usize, isize, isize); MAX_WALK]>;

/// Where a walk finds an operand's elements: the element offset of the walk's first
/// element and one stride per walked dimension.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub offset: usize,
    pub strides: Strides,
}

impl Layout {
    pub fn new(offset: usize, strides: impl IntoIterator<Item = isize>) -> Self {
        Layout {
            offset,
            strides: strides.into_iter().collect(),
        }
    }

    /// The row-major layout of `sizes`.
    pub fn contiguous(sizes: &[usize]) -> Self {
        Layout::new(0, row_major(sizes))
    }

    /// The layout of a tensor in its own dim order, walked in logical dimension order.
    pub fn of(info: &TensorInfo) -> Self {
        Layout::new(0, info.strides().iter().map(|&s| s as isize))
    }
}

/// Row-major strides of `sizes`.
pub fn row_major(sizes: &[usize]) -> Strides {
    let mut strides: Strides = smallvec::smallvec![0; sizes.len()];
    let mut step = 1isize;
    for (s, &n) in strides.iter_mut().zip(sizes).rev() {
        *s = step;
        step = step.saturating_mul(n.max(1) as isize);
    }
    strides
}

/// Dispatches on an element size: runs `$body` with `$E` an unsigned integer type of that
/// size, which moves elements of any dtype of that size.
macro_rules! by_elem_size {
    ($size:expr, $E:ident => $body:expr) => {
        match $size {
            1 => {
                type $E = u8;
                $body
            }
            2 => {
                type $E = u16;
                $body
            }
            4 => {
                type $E = u32;
                $body
            }
            8 => {
                type $E = u64;
                $body
            }
            16 => {
                type $E = u128;
                $body
            }
            other => Err(pte_runtime::KernelError::invalid(format!(
                "elements of {other} bytes are not supported"
            ))),
        }
    };
}
pub(crate) use by_elem_size;

/// Views mutable bytes (of a tensor view or a [`Buffer`], so aligned) as `T`.
pub fn typed_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> KernelResult<&mut [T]> {
    // An empty tensor's data may sit at any address.
    if bytes.is_empty() {
        return Ok(&mut []);
    }
    let len = bytes.len();
    bytemuck::try_cast_slice_mut(bytes)
        .map_err(|e| KernelError::Failed(format!("tensor data of {len} bytes: {e}")))
}

/// Views bytes (of a tensor view or a [`Buffer`], so aligned) as `T`.
pub fn typed<T: bytemuck::Pod>(bytes: &[u8]) -> KernelResult<&[T]> {
    if bytes.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes)
        .map_err(|e| KernelError::Failed(format!("tensor data of {} bytes: {e}", bytes.len())))
}

/// Checks that every element a layout reaches over `sizes` lies in a buffer of `len`
/// elements (`sizes` must hold at least one element).
fn check_bounds(sizes: &[usize], l: &Layout, len: usize, what: &str) -> KernelResult {
    let (mut lo, mut hi) = (l.offset as i128, l.offset as i128);
    for (&n, &s) in sizes.iter().zip(&l.strides) {
        let span = (n as i128 - 1) * s as i128;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    if l.strides.len() != sizes.len() || lo < 0 || hi >= len as i128 {
        return Err(KernelError::invalid(format!(
            "{what} layout (offset {}, strides {:?}) over sizes {sizes:?} leaves its {len} elements",
            l.offset, l.strides
        )));
    }
    Ok(())
}

/// Copies the elements of shape `sizes` read through `s` in `src` to the places `d` names
/// in `dst`; `esize` is the element size in bytes.
pub fn copy(
    esize: usize,
    sizes: &[usize],
    src: &[u8],
    s: &Layout,
    dst: &mut [u8],
    d: &Layout,
) -> KernelResult {
    let Some(dims) = coalesced(esize, sizes, src, s, dst, d)? else {
        return Ok(());
    };
    by_elem_size!(esize, E => walk::<E>(&dims, typed::<E>(src)?, s.offset, typed_mut::<E>(dst)?, d.offset))
}

/// Bytes below which a copy stays on one thread (the hand-off costs about a microsecond).
pub(crate) const PARALLEL_COPY_BYTES: usize = 1 << 14;

/// [`copy`] into `dst` in the row-major order of `sizes` (as [`Layout::contiguous`]),
/// split over the pool's threads by outer rows when it moves enough bytes.
pub fn copy_to_contiguous(
    pool: &ThreadPool,
    esize: usize,
    sizes: &[usize],
    src: &[u8],
    s: &Layout,
    dst: &mut [u8],
) -> KernelResult {
    let d = Layout::contiguous(sizes);
    let Some(dims) = coalesced(esize, sizes, src, s, dst, &d)? else {
        return Ok(());
    };
    if let Some((batch, rows, cols)) = as_transposes(&dims) {
        // A permutation that transposes dense matrices (K → Kᵀ in attention, NCHW ⇄
        // NHWC): the blocked transpose instead of an element-by-element walk.
        let len = batch * rows * cols;
        return by_elem_size!(esize, E => {
            let x = typed::<E>(src)?.get(s.offset..s.offset + len).ok_or_else(oob)?;
            let y = typed_mut::<E>(dst)?.get_mut(..len).ok_or_else(oob)?;
            pte_compute::layout::transpose(pool, x, batch, rows, cols, y).map_err(compute_error)
        });
    }
    if pool.threads() == 1 || dst.len() < PARALLEL_COPY_BYTES {
        return by_elem_size!(esize, E => walk::<E>(&dims, typed::<E>(src)?, s.offset, typed_mut::<E>(dst)?, 0));
    }
    // Outer dims enough for a few rows per thread; at least one dim stays inner.
    let (mut rows, mut split) = (1usize, 0);
    while split + 1 < dims.len() && rows < pool.threads() * 4 {
        rows = rows.saturating_mul(dims.get(split).map_or(1, |d| d.0));
        split += 1;
    }
    let (outer, inner) = dims.split_at(split);
    let row: usize = inner.iter().map(|d| d.0).product();
    if rows < 2 {
        return by_elem_size!(esize, E => walk::<E>(&dims, typed::<E>(src)?, s.offset, typed_mut::<E>(dst)?, 0));
    }
    by_elem_size!(esize, E => {
        let (src, dst) = (typed::<E>(src)?, typed_mut::<E>(dst)?);
        let dst = dst.get_mut(..rows * row).ok_or_else(oob)?;
        let failed = std::sync::atomic::AtomicBool::new(false);
        pool.parallel_chunks(dst, row, &mut [0u8; 0], 0, |r, out, _| {
            // The row's source offset from its outer multi-index.
            let mut rest = r;
            let mut at = s.offset as isize;
            for &(n, ss, _) in outer.iter().rev() {
                at += (rest % n) as isize * ss;
                rest /= n;
            }
            if walk::<E>(inner, src, at as usize, out, 0).is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .map_err(compute_error)?;
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(oob());
        }
        Ok(())
    })
}

/// A coalesced walk that is `batch` transposes of dense `rows × cols` source matrices
/// into dense `cols × rows` ones: `(batch, rows, cols)`.
fn as_transposes(dims: &[(usize, isize, isize)]) -> Option<(usize, usize, usize)> {
    let (batch, inner) = match dims {
        [(b, sb, db), inner @ ..] if inner.len() == 2 => (Some((*b, *sb, *db)), inner),
        inner => (None, inner),
    };
    let [(cols, 1, dc), (rows, sr, 1)] = *inner else {
        return None;
    };
    let image = rows.checked_mul(cols)?;
    let dense = dc == rows as isize && sr == cols as isize;
    match batch {
        None if dense => Some((1, rows, cols)),
        Some((b, sb, db)) if dense && sb == image as isize && db == image as isize => {
            Some((b, rows, cols))
        }
        _ => None,
    }
}

/// Checks a copy's operands and returns its walk with size-1 dims dropped and a dim
/// merged into the next inner one where both operands step over it contiguously; None
/// when there is nothing to copy.
fn coalesced(
    esize: usize,
    sizes: &[usize],
    src: &[u8],
    s: &Layout,
    dst: &[u8],
    d: &Layout,
) -> KernelResult<Option<WalkDims>> {
    if sizes.contains(&0) {
        return Ok(None);
    }
    if esize == 0 || !src.len().is_multiple_of(esize) || !dst.len().is_multiple_of(esize) {
        return Err(KernelError::invalid(format!(
            "buffers of {} and {} bytes do not hold {esize}-byte elements",
            src.len(),
            dst.len()
        )));
    }
    check_bounds(sizes, s, src.len() / esize, "source")?;
    check_bounds(sizes, d, dst.len() / esize, "destination")?;
    let mut dims = WalkDims::new();
    for ((&n, &ss), &ds) in sizes.iter().zip(&s.strides).zip(&d.strides) {
        if n == 1 {
            continue;
        }
        match dims.last_mut() {
            Some(last) if last.1 == ss * n as isize && last.2 == ds * n as isize => {
                *last = (last.0 * n, ss, ds);
            }
            _ => dims.push((n, ss, ds)),
        }
    }
    Ok(Some(dims))
}

/// The copy loop over coalesced `(size, src stride, dst stride)` dims (bounds checked by
/// the caller; every access is checked again, failing instead of panicking).
fn walk<E: Copy>(
    dims: &[(usize, isize, isize)],
    src: &[E],
    so: usize,
    dst: &mut [E],
    doff: usize,
) -> KernelResult {
    let Some((&(n, ss, ds), outer)) = dims.split_last() else {
        *dst.get_mut(doff).ok_or_else(oob)? = *src.get(so).ok_or_else(oob)?;
        return Ok(());
    };
    let mut index: Walk = smallvec::smallvec![0; outer.len()];
    let (mut sp, mut dp) = (so as isize, doff as isize);
    loop {
        if ss == 1 && ds == 1 {
            let (a, b) = (sp as usize, dp as usize);
            let from = src.get(a..a + n).ok_or_else(oob)?;
            dst.get_mut(b..b + n).ok_or_else(oob)?.copy_from_slice(from);
        } else {
            for k in 0..n as isize {
                let v = *src.get((sp + k * ss) as usize).ok_or_else(oob)?;
                *dst.get_mut((dp + k * ds) as usize).ok_or_else(oob)? = v;
            }
        }
        // Advance the outer multi-index.
        let mut done = true;
        for (idx, &(size, s, d)) in index.iter_mut().zip(outer).rev() {
            *idx += 1;
            sp += s;
            dp += d;
            if *idx < size {
                done = false;
                break;
            }
            *idx = 0;
            sp -= s * size as isize;
            dp -= d * size as isize;
        }
        if done {
            return Ok(());
        }
    }
}

/// Converts the elements of `src` (dtype `from`) into `dst` (dtype `to`), as PyTorch's
/// `Tensor.to` does (a real number becomes a complex one with no imaginary part, a
/// complex one keeps its real part, or for bool, whether it is non-zero).
pub fn convert_bytes(src: &[u8], from: DType, dst: &mut [u8], to: DType) -> KernelResult {
    if from.is_complex() || to.is_complex() {
        return convert_complex(src, from, dst, to);
    }
    crate::dispatch_all!(from, S => {
        let s = typed::<S>(src)?;
        crate::dispatch_all!(to, D => {
            let d = typed_mut::<D>(dst)?;
            if s.len() != d.len() {
                return Err(KernelError::invalid(format!("cannot convert {} elements into {}", s.len(), d.len())));
            }
            convert(s, d, to == DType::Bool);
            Ok(())
        }, Err(KernelError::dtypes(&[from, to])))
    }, Err(KernelError::dtypes(&[from, to])))
}

/// [`convert_bytes`] where either dtype is complex.
fn convert_complex(src: &[u8], from: DType, dst: &mut [u8], to: DType) -> KernelResult {
    let v = Vals::of_dtype(from, src)?;
    let n = if from.is_complex() {
        v.len() / 2
    } else {
        v.len()
    };
    let part = |i: usize, k: usize| -> KernelResult<f64> {
        match (from.is_complex(), k) {
            (true, k) => v.at(2 * i + k),
            (false, 0) => v.at(i),
            (false, _) => Ok(0.0),
        }
    };
    let mismatch = || KernelError::invalid(format!("cannot convert {n} {from} elements to {to}"));
    if to.is_complex() {
        crate::dispatch_types!(to, P => {
            let d = typed_mut::<P>(dst)?;
            if d.len() != 2 * n {
                return Err(mismatch());
            }
            for (i, pair) in d.chunks_exact_mut(2).enumerate() {
                for (k, p) in pair.iter_mut().enumerate() {
                    *p = P::from_f64(part(i, k)?);
                }
            }
            Ok(())
        }, Err(KernelError::dtypes(&[from, to])), [C32 => f16, C64 => f32, C128 => f64])
    } else {
        crate::dispatch_all!(to, D => {
            let d = typed_mut::<D>(dst)?;
            if d.len() != n {
                return Err(mismatch());
            }
            for (i, o) in d.iter_mut().enumerate() {
                let re = part(i, 0)?;
                *o = if to == DType::Bool {
                    D::from_i64(i64::from(re != 0.0 || part(i, 1)? != 0.0))
                } else {
                    D::from_f64(re)
                };
            }
            Ok(())
        }, Err(KernelError::dtypes(&[from, to])))
    }
}

/// The scratch piece [`as_dtype`] needs to read `t` as `to`: none when the dtypes match.
pub fn as_dtype_piece(t: &TensorInfo, to: DType) -> (usize, usize) {
    let len = if t.dtype == to { 0 } else { t.numel() };
    (to.size(), len)
}

/// A tensor's data as elements of `to`: its own bytes when the dtypes match, else a
/// converted copy (same layout) in the piece of `scratch` [`as_dtype_piece`] declared.
pub fn as_dtype<'a>(
    info: &TensorInfo,
    bytes: &'a [u8],
    to: DType,
    scratch: &mut Scratch<'a>,
) -> KernelResult<&'a [u8]> {
    if info.dtype == to {
        return Ok(bytes);
    }
    let nbytes = info
        .numel()
        .checked_mul(to.size())
        .ok_or_else(|| KernelError::invalid("tensor size overflows"))?;
    let buf = scratch.take::<u8>(nbytes)?;
    convert_bytes(bytes, info.dtype, buf, to)?;
    Ok(buf)
}

/// Strides for reading a tensor of layout `info` as if broadcast to `sizes` (0 along
/// broadcast dims and new leading dims).
pub fn broadcast_layout(info: &TensorInfo, sizes: &[usize]) -> KernelResult<Layout> {
    let own = info.strides();
    let bad = || {
        KernelError::invalid(format!(
            "cannot broadcast {:?} to {sizes:?}",
            info.sizes.as_slice()
        ))
    };
    let lead = sizes.len().checked_sub(info.rank()).ok_or_else(bad)?;
    let mut strides: Strides = smallvec::smallvec![0; sizes.len()];
    let tail = strides.get_mut(lead..).ok_or_else(bad)?;
    let wanted = sizes.get(lead..).ok_or_else(bad)?;
    for (((s, &n), &want), &st) in tail.iter_mut().zip(&info.sizes).zip(wanted).zip(&own) {
        if n == want {
            *s = st as isize;
        } else if n != 1 {
            return Err(bad());
        }
    }
    Ok(Layout::new(0, strides))
}

/// Copies `src` into `dst`: broadcast to `dst`'s sizes and converted to its dtype (in
/// `scratch`), each tensor in its own dim order (the walk follows `dst`'s memory order).
pub fn copy_into(
    src: &TensorData<'_>,
    dst: &mut TensorDataMut<'_>,
    scratch: &mut Buffer,
) -> KernelResult {
    let sizes = dst.info.sizes.clone();
    let s = broadcast_layout(src.info, &sizes)?;
    let d = Layout::of(dst.info);
    let order = &dst.info.dim_order;
    let pick = |v: &[usize]| -> KernelResult<Walk> {
        order
            .iter()
            .map(|&k| v.get(k).copied().ok_or_else(oob))
            .collect()
    };
    let pick_strides = |v: &[isize]| -> KernelResult<Strides> {
        order
            .iter()
            .map(|&k| v.get(k).copied().ok_or_else(oob))
            .collect()
    };
    let walk = pick(&sizes)?;
    let s = Layout::new(0, pick_strides(&s.strides)?);
    let d = Layout::new(0, pick_strides(&d.strides)?);
    let mut scratch = Scratch::new(scratch, &[as_dtype_piece(src.info, dst.info.dtype)])?;
    let data = as_dtype(src.info, src.bytes(), dst.info.dtype, &mut scratch)?;
    copy(dst.info.dtype.size(), &walk, data, &s, dst.bytes_mut(), &d)
}

/// Sets every element of `bytes`, elements of `dtype`, to `value` (complex: with no
/// imaginary part).
pub fn fill(dtype: DType, bytes: &mut [u8], value: Scalar) -> KernelResult {
    if dtype.is_complex() {
        return crate::dispatch_types!(dtype, P => {
            let re = P::from_f64(value.to_f64());
            for pair in typed_mut::<P>(bytes)?.chunks_exact_mut(2) {
                if let [r, i] = pair {
                    *r = re;
                    *i = P::default();
                }
            }
            Ok(())
        }, Err(KernelError::dtypes(&[dtype])), [C32 => f16, C64 => f32, C128 => f64]);
    }
    crate::dispatch_all!(dtype, T => {
        let v = scalar_as::<T>(value, dtype == DType::Bool);
        typed_mut::<T>(bytes)?.fill(v);
        Ok(())
    }, Err(KernelError::dtypes(&[dtype])))
}

/// The first element of a tensor as a scalar: `Bool` for bools, `Double` for floats,
/// `Int` for integers.
pub fn first_scalar(info: &TensorInfo, bytes: &[u8]) -> KernelResult<Scalar> {
    crate::dispatch_all!(info.dtype, T => {
        let v = *typed::<T>(bytes)?.first().ok_or_else(|| KernelError::invalid("the tensor is empty"))?;
        Ok(if info.dtype == DType::Bool {
            Scalar::Bool(v.to_i64() != 0)
        } else if T::FLOAT {
            Scalar::Double(v.to_f64())
        } else {
            Scalar::Int(v.to_i64())
        })
    }, Err(KernelError::dtypes(&[info.dtype])))
}

/// A tensor's elements of any dtype kernels compute on, read one by one as `f64`.
#[derive(Clone, Copy)]
pub enum Vals<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    I64(&'a [i64]),
    I32(&'a [i32]),
    I16(&'a [i16]),
    I8(&'a [i8]),
    U8(&'a [u8]),
    /// A complex tensor's parts (real, imaginary, ...): read as real numbers, twice as
    /// many.
    C32(&'a [f16]),
    C64(&'a [f32]),
    C128(&'a [f64]),
}

impl<'a> Vals<'a> {
    pub fn of(info: &TensorInfo, bytes: &'a [u8]) -> KernelResult<Self> {
        Self::of_dtype(info.dtype, bytes)
    }

    /// The elements of `bytes`, of `dtype`.
    pub fn of_dtype(dtype: DType, bytes: &'a [u8]) -> KernelResult<Self> {
        Ok(match dtype {
            DType::F32 => Vals::F32(typed(bytes)?),
            DType::F64 => Vals::F64(typed(bytes)?),
            DType::F16 => Vals::F16(typed(bytes)?),
            DType::BF16 => Vals::BF16(typed(bytes)?),
            DType::I64 => Vals::I64(typed(bytes)?),
            DType::I32 => Vals::I32(typed(bytes)?),
            DType::I16 => Vals::I16(typed(bytes)?),
            DType::I8 => Vals::I8(typed(bytes)?),
            DType::U8 | DType::Bool => Vals::U8(typed(bytes)?),
            DType::C32 => Vals::C32(typed(bytes)?),
            DType::C64 => Vals::C64(typed(bytes)?),
            DType::C128 => Vals::C128(typed(bytes)?),
            other => return Err(KernelError::dtypes(&[other])),
        })
    }

    /// Input `k` of a [`Dense`] view.
    pub fn input(io: &Dense<'a>, k: usize) -> KernelResult<Self> {
        let (info, bytes) = io.inputs.get(k).ok_or_else(oob)?;
        Self::of(info, bytes)
    }

    /// Elements (complex tensors: parts).
    pub fn len(self) -> usize {
        match self {
            Vals::F32(s) => s.len(),
            Vals::F64(s) => s.len(),
            Vals::F16(s) => s.len(),
            Vals::BF16(s) => s.len(),
            Vals::I64(s) => s.len(),
            Vals::I32(s) => s.len(),
            Vals::I16(s) => s.len(),
            Vals::I8(s) => s.len(),
            Vals::U8(s) => s.len(),
            Vals::C32(s) => s.len(),
            Vals::C64(s) => s.len(),
            Vals::C128(s) => s.len(),
        }
    }

    /// Element (complex tensors: part) `i`.
    pub fn at(self, i: usize) -> KernelResult<f64> {
        fn get<T: Elem>(s: &[T], i: usize) -> KernelResult<f64> {
            s.get(i).map(|v| v.to_f64()).ok_or_else(oob)
        }
        match self {
            Vals::F32(s) => get(s, i),
            Vals::F64(s) => get(s, i),
            Vals::F16(s) => get(s, i),
            Vals::BF16(s) => get(s, i),
            Vals::I64(s) => get(s, i),
            Vals::I32(s) => get(s, i),
            Vals::I16(s) => get(s, i),
            Vals::I8(s) => get(s, i),
            Vals::U8(s) => get(s, i),
            Vals::C32(s) => get(s, i),
            Vals::C64(s) => get(s, i),
            Vals::C128(s) => get(s, i),
        }
    }
}

/// Sizes and layout of the `len` entries of `dim` from `start` (every `step`-th) of a
/// contiguous tensor of `sizes`; with `drop`, the dim is removed (`len` must be 1).
pub fn window(
    sizes: &[usize],
    dim: usize,
    start: usize,
    len: usize,
    step: usize,
    drop: bool,
) -> KernelResult<(pte_runtime::Dims, Layout)> {
    let mut sizes: pte_runtime::Dims = sizes.into();
    let mut st: Strides = row_major(&sizes);
    let stride = *st.get(dim).ok_or_else(oob)?;
    let overflow = || KernelError::invalid("slice start or step is too large");
    let offset = start.checked_mul(stride as usize).ok_or_else(overflow)?;
    if drop {
        sizes.remove(dim);
        st.remove(dim);
    } else {
        *sizes.get_mut(dim).ok_or_else(oob)? = len;
        // With at most one entry the step is never taken, and may be any size.
        *st.get_mut(dim).ok_or_else(oob)? = if len <= 1 {
            stride
        } else {
            isize::try_from(step)
                .ok()
                .and_then(|s| stride.checked_mul(s))
                .ok_or_else(overflow)?
        };
    }
    Ok((sizes, Layout::new(offset, st)))
}

/// A tensor seen as `outer × total × inner` around the dim that `cat`, `stack` and the
/// splits work along.
#[derive(Clone, Copy)]
pub struct Along {
    pub outer: usize,
    pub total: usize,
    pub inner: usize,
}

impl Along {
    pub fn new(sizes: &[usize], dim: usize) -> Self {
        let (outer, total, inner) = crate::util::split_at_dim(sizes, dim);
        Along {
            outer,
            total,
            inner,
        }
    }

    /// Where entries `at..at + extent` of the dim sit: the walk and the layout.
    pub fn part(self, at: usize, extent: usize) -> ([usize; 2], Layout) {
        let layout = Layout::new(at * self.inner, [(self.total * self.inner) as isize, 1]);
        ([self.outer, extent * self.inner], layout)
    }
}

/// The walk and layouts that move a tensor of `info`'s layout to or from its contiguous
/// (row-major) form, walked in the tensor's memory order.
fn reorder(info: &TensorInfo) -> KernelResult<(Walk, Layout, Layout)> {
    let own = Layout::of(info);
    let dense = Layout::contiguous(&info.sizes);
    let mut walk = Walk::new();
    let (mut a, mut b) = (Strides::new(), Strides::new());
    for &k in &info.dim_order {
        walk.push(*info.sizes.get(k).ok_or_else(oob)?);
        a.push(*own.strides.get(k).ok_or_else(oob)?);
        b.push(*dense.strides.get(k).ok_or_else(oob)?);
    }
    Ok((walk, Layout::new(0, a), Layout::new(0, b)))
}

/// A tensor argument's elements in row-major order, copied into memory charged to the
/// method's budget (kept charged while the returned [`Charge`] lives).
pub fn read_dense<T: Element + bytemuck::Zeroable>(
    args: &Args<'_>,
    a: Arg,
) -> KernelResult<(Vec<T>, Charge)> {
    let t = args.read(a)?;
    t.as_slice::<T>()?;
    let n = t.info.numel();
    let memory = |source| KernelError::Memory {
        what: format!("a copy of {a:?}"),
        source,
    };
    let bytes = t.info.nbytes() as u64;
    let charge = args.budget().charge(bytes).map_err(memory)?;
    let mut v: Vec<T> = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| memory(MemoryError::AllocFailed { requested: bytes }))?;
    v.resize(n, T::zeroed());
    let (walk, own, dense) = reorder(t.info)?;
    let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    copy(t.info.dtype.size(), &walk, t.bytes(), &own, dst, &dense)?;
    Ok((v, charge))
}

/// Tensors of any dim order seen in the default (row-major) order: views of those
/// already in it, copies in scratch memory of the others. Build with [`Dense::io`], run
/// the kernel on [`Dense::inputs`] and [`Dense::outputs`], then [`Dense::finish`] writes
/// results computed in scratch to their outputs.
pub struct Dense<'a> {
    /// Input bytes in row-major order, with their metadata (dim order made default).
    pub inputs: SmallVec<[(TensorInfo, &'a [u8]); 8]>,
    /// Output bytes in row-major order.
    pub outputs: SmallVec<[(TensorInfo, &'a mut [u8]); 4]>,
    /// Outputs whose bytes are scratch: their real views, to scatter into.
    pending: SmallVec<[(usize, TensorDataMut<'a>); 4]>,
    /// The kernel's own scratch pieces, declared when building.
    pub scratch: Scratch<'a>,
}

impl<'a> Dense<'a> {
    /// Views of `reads` and `writes` of any dim order, and scratch pieces `pieces` for the
    /// kernel (taken from [`Dense::scratch`] in order).
    pub fn io(
        args: &'a mut Args<'_>,
        reads: &[Arg],
        writes: &[Arg],
        pieces: &[(usize, usize)],
    ) -> KernelResult<Self> {
        Self::new(args.io_strided(reads, writes)?, true, pieces)
    }

    /// Views of `reads` and `writes` in memory order, whatever their dim orders: for
    /// kernels that only pair up elements at the same memory position (elementwise
    /// operations on tensors that share one layout).
    pub fn memory_order(
        args: &'a mut Args<'_>,
        reads: &[Arg],
        writes: &[Arg],
        pieces: &[(usize, usize)],
    ) -> KernelResult<Self> {
        Self::new(args.io_strided(reads, writes)?, false, pieces)
    }

    fn new(io: Io<'a>, reorder_all: bool, pieces: &[(usize, usize)]) -> KernelResult<Self> {
        let moved = |t: &TensorInfo| reorder_all && !t.is_contiguous();
        let Io {
            inputs,
            outputs,
            scratch,
        } = io;
        let mut all: SmallVec<[(usize, usize); 12]> = SmallVec::new();
        for info in inputs
            .iter()
            .map(|t| &t.info)
            .chain(outputs.iter().map(|t| &t.info))
        {
            if moved(info) {
                all.push(Scratch::piece::<u8>(info.nbytes()));
            }
        }
        all.extend_from_slice(pieces);
        let mut scratch = Scratch::new(scratch, &all)?;
        let mut dense_inputs = SmallVec::new();
        for t in inputs {
            let mut info = t.info.clone();
            if !moved(&info) {
                dense_inputs.push((info, t.bytes()));
                continue;
            }
            let buf = scratch.take::<u8>(t.info.nbytes())?;
            let (walk, own, dense) = reorder(t.info)?;
            copy(t.info.dtype.size(), &walk, t.bytes(), &own, buf, &dense)?;
            info.dim_order = (0..info.rank()).collect();
            dense_inputs.push((info, &*buf));
        }
        let mut dense_outputs = SmallVec::new();
        let mut pending = SmallVec::new();
        for (k, mut t) in outputs.into_iter().enumerate() {
            let mut info = t.info.clone();
            if !moved(&info) {
                dense_outputs.push((info, t.into_bytes()));
                continue;
            }
            // Kernels may write part of an output: start from what it holds.
            let buf = scratch.take::<u8>(t.info.nbytes())?;
            let (walk, own, dense) = reorder(t.info)?;
            copy(t.info.dtype.size(), &walk, t.bytes_mut(), &own, buf, &dense)?;
            info.dim_order = (0..info.rank()).collect();
            dense_outputs.push((info, buf));
            pending.push((k, t));
        }
        Ok(Dense {
            inputs: dense_inputs,
            outputs: dense_outputs,
            pending,
            scratch,
        })
    }

    /// Input `k` as a slice of `T`.
    pub fn input<T: bytemuck::Pod>(&self, k: usize) -> KernelResult<&'a [T]> {
        typed(self.inputs.get(k).ok_or_else(oob)?.1)
    }

    /// Output `k` as a slice of `T`.
    pub fn output<T: bytemuck::Pod>(&mut self, k: usize) -> KernelResult<&mut [T]> {
        typed_mut(self.outputs.get_mut(k).ok_or_else(oob)?.1)
    }

    /// The bytes of input `k`.
    pub fn bytes(&self, k: usize) -> KernelResult<&'a [u8]> {
        Ok(self.inputs.get(k).ok_or_else(oob)?.1)
    }

    /// The bytes of output `k`.
    pub fn bytes_mut(&mut self, k: usize) -> KernelResult<&mut [u8]> {
        Ok(self.outputs.get_mut(k).ok_or_else(oob)?.1)
    }

    /// Outputs 0 and 1 as slices of `A` and `B`.
    pub fn outputs2<A: bytemuck::Pod, B: bytemuck::Pod>(
        &mut self,
    ) -> KernelResult<(&mut [A], &mut [B])> {
        match self.outputs.as_mut_slice() {
            [(_, a), (_, b), ..] => Ok((typed_mut(a)?, typed_mut(b)?)),
            _ => Err(oob()),
        }
    }

    /// Writes the results computed in scratch into their outputs.
    pub fn finish(self) -> KernelResult {
        let Dense {
            outputs, pending, ..
        } = self;
        for (k, mut t) in pending {
            let (_, bytes) = outputs.get(k).ok_or_else(oob)?;
            let (walk, own, dense) = reorder(t.info)?;
            let esize = t.info.dtype.size();
            copy(esize, &walk, bytes, &dense, t.bytes_mut(), &own)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_transposed_and_reversed() {
        let src: Vec<u8> = (0..6).collect();
        let mut dst = vec![0u8; 6];
        // Transpose a 2x3 matrix.
        copy(
            1,
            &[3, 2],
            &src,
            &Layout::new(0, [1, 3]),
            &mut dst,
            &Layout::contiguous(&[3, 2]),
        )
        .unwrap();
        assert_eq!(dst, [0, 3, 1, 4, 2, 5]);
        // Reverse the columns.
        copy(
            1,
            &[2, 3],
            &src,
            &Layout::new(2, [3, -1]),
            &mut dst,
            &Layout::contiguous(&[2, 3]),
        )
        .unwrap();
        assert_eq!(dst, [2, 1, 0, 5, 4, 3]);
        // Out-of-bounds layouts are errors, not panics.
        assert!(copy(
            1,
            &[2, 3],
            &src,
            &Layout::new(1, [3, 1]),
            &mut dst,
            &Layout::contiguous(&[2, 3])
        )
        .is_err());
    }

    #[test]
    fn dense_matrix_transposes_are_recognized() {
        // K [3, 197, 64] → Kᵀ [3, 64, 197]: three transposes of 197 × 64.
        let walk = |sizes: &[usize], strides: &[isize]| {
            let src = vec![0u8; 4 * 3 * 197 * 64 + 256];
            let dst = vec![0u8; 4 * sizes.iter().product::<usize>()];
            let s = Layout::new(64, strides.iter().copied());
            coalesced(4, sizes, &src, &s, &dst, &Layout::contiguous(sizes))
                .unwrap()
                .unwrap()
        };
        let kt = walk(&[3, 64, 197], &[197 * 64, 1, 64]);
        assert_eq!(as_transposes(&kt), Some((3, 197, 64)));
        let one = walk(&[1, 64, 197], &[0, 1, 64]);
        assert_eq!(as_transposes(&one), Some((1, 197, 64)));
        // Not dense (every other row) or not a transposition: the general walk.
        let sparse = walk(&[3, 64, 98], &[197 * 64, 1, 128]);
        assert_eq!(as_transposes(&sparse), None);
        let heads = walk(&[3, 197, 64], &[64, 192, 1]);
        assert_eq!(as_transposes(&heads), None);
    }

    #[test]
    fn parallel_and_transposing_copies_match_the_serial_one() {
        let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(3).unwrap()];
        // Permutations (the third and fourth transpose dense matrices, the fourth at
        // an offset), a broadcast (stride 0) and a reversed walk, with outer sizes
        // below, at and above the rows the split wants, of 4-byte and 1-byte elements.
        let cases: [(&[usize], &[usize], &[isize]); 6] = [
            (&[3, 197, 64], &[197, 3, 64], &[64, 192, 1]),
            (&[3, 64, 197], &[3 * 197 * 64 + 64], &[197 * 64, 1, 64]),
            (
                &[1, 2, 131, 257],
                &[1, 2, 131, 257],
                &[0, 131 * 257, 257, 1],
            ),
            (
                &[7, 5, 33, 41],
                &[7, 5, 33, 41],
                &[5 * 33 * 41, 33 * 41, 1, 33],
            ),
            (&[24, 4096], &[1, 4096], &[0, 1]),
            (&[17, 1000], &[17, 1000], &[1000, -1]),
        ];
        for esize in [4, 1] {
            for (sizes, src_sizes, strides) in cases {
                let n_src: usize = src_sizes.iter().product::<usize>() * esize;
                let src: Vec<u8> = (0..n_src).map(|i| (i * 7 % 251) as u8).collect();
                let offset = match strides.last() {
                    Some(&-1) => 999,
                    _ if src_sizes.len() == 1 => 64,
                    _ => 0,
                };
                let layout = Layout::new(offset, strides.iter().copied());
                let n: usize = sizes.iter().product::<usize>() * esize;
                let mut want = vec![0u8; n];
                copy(
                    esize,
                    sizes,
                    &src,
                    &layout,
                    &mut want,
                    &Layout::contiguous(sizes),
                )
                .unwrap();
                for pool in &pools {
                    let mut got = vec![1u8; n];
                    copy_to_contiguous(pool, esize, sizes, &src, &layout, &mut got).unwrap();
                    assert_eq!(got, want, "sizes {sizes:?} esize {esize}");
                }
            }
        }
        // A source too short is an error on the parallel path too.
        let mut dst = vec![0u8; 1 << 18];
        let short = vec![0u8; 16];
        let layout = Layout::contiguous(&[64, 1024]);
        assert!(copy_to_contiguous(&pools[1], 4, &[64, 1024], &short, &layout, &mut dst).is_err());
    }
}
