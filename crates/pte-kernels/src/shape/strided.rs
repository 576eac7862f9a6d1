//! The machinery behind every data-movement kernel: a dtype-agnostic strided element copy,
//! dtype conversion of whole buffers, and fills.
//!
//! [`copy`] walks a shape once with a source and a destination [`Layout`] (offset and
//! strides in elements, negative strides allowed). Before walking it checks both layouts
//! against their buffers, drops size-1 dimensions and merges dimensions that are
//! contiguous in both operands, so a copy that is contiguous in its innermost dimension
//! becomes a loop of `memcpy`s. Elements move as unsigned integers of their size
//! ([`by_elem_size!`]), so one instantiation per element size serves every dtype.
//! Walks of up to [`MAX_WALK`] dimensions (twice the usual rank, for `repeat`) stay on
//! the stack; converted copies live in the method's scratch memory.

use pte_runtime::{
    Buffer, DType, KernelError, KernelResult, Scalar, TensorData, TensorDataMut, TensorInfo,
};
use smallvec::SmallVec;

use crate::util::{convert, Elem, Scratch};

/// Dimensions of a walk kept inline.
pub(crate) const MAX_WALK: usize = 16;

/// Strides in elements; negative for reversed walks.
pub(crate) type Strides = SmallVec<[isize; MAX_WALK]>;

/// The sizes of a walk.
pub(crate) type Walk = SmallVec<[usize; MAX_WALK]>;

/// Where a walk finds an operand's elements: the element offset of the walk's first
/// element and one stride per walked dimension.
#[derive(Clone, Debug, Default)]
pub(crate) struct Layout {
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
pub(crate) fn row_major(sizes: &[usize]) -> Strides {
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
            other => Err(pte_runtime::KernelError::invalid(format!(
                "elements of {other} bytes are not supported"
            ))),
        }
    };
}
pub(crate) use by_elem_size;

/// Views mutable bytes (of a tensor view or an [`Buffer`], so aligned) as `T`.
pub(crate) fn typed_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> KernelResult<&mut [T]> {
    // An empty tensor's data may sit at any address.
    if bytes.is_empty() {
        return Ok(&mut []);
    }
    let len = bytes.len();
    bytemuck::try_cast_slice_mut(bytes)
        .map_err(|e| KernelError::Failed(format!("tensor data of {len} bytes: {e}")))
}

/// Views bytes (of a tensor view or an [`Buffer`], so aligned) as `T`.
pub(crate) fn typed<T: bytemuck::Pod>(bytes: &[u8]) -> KernelResult<&[T]> {
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
pub(crate) fn copy(
    esize: usize,
    sizes: &[usize],
    src: &[u8],
    s: &Layout,
    dst: &mut [u8],
    d: &Layout,
) -> KernelResult {
    if sizes.contains(&0) {
        return Ok(());
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
    // Coalesce: drop size-1 dims, merge a dim into the next inner one when both operands
    // step over it contiguously.
    let mut dims: SmallVec<[(usize, isize, isize); MAX_WALK]> = SmallVec::new();
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
    by_elem_size!(esize, E => walk::<E>(&dims, typed::<E>(src)?, s.offset, typed_mut::<E>(dst)?, d.offset))
}

/// The copy loop over coalesced `(size, src stride, dst stride)` dims, offsets checked.
fn walk<E: Copy>(
    dims: &[(usize, isize, isize)],
    src: &[E],
    so: usize,
    dst: &mut [E],
    doff: usize,
) -> KernelResult {
    let Some((&(n, ss, ds), outer)) = dims.split_last() else {
        dst[doff] = src[so];
        return Ok(());
    };
    let mut index: Walk = smallvec::smallvec![0; outer.len()];
    let (mut sp, mut dp) = (so as isize, doff as isize);
    loop {
        if ss == 1 && ds == 1 {
            let (a, b) = (sp as usize, dp as usize);
            dst[b..b + n].copy_from_slice(&src[a..a + n]);
        } else {
            for k in 0..n as isize {
                dst[(dp + k * ds) as usize] = src[(sp + k * ss) as usize];
            }
        }
        // Advance the outer multi-index.
        let mut level = outer.len();
        loop {
            if level == 0 {
                return Ok(());
            }
            level -= 1;
            let (size, s, d) = outer[level];
            index[level] += 1;
            sp += s;
            dp += d;
            if index[level] < size {
                break;
            }
            index[level] = 0;
            sp -= s * size as isize;
            dp -= d * size as isize;
        }
    }
}

/// Converts the elements of `src` (dtype `from`) into `dst` (dtype `to`), as PyTorch's
/// `Tensor.to` does.
pub(crate) fn convert_bytes(src: &[u8], from: DType, dst: &mut [u8], to: DType) -> KernelResult {
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

/// The scratch piece [`as_dtype`] needs to read `t` as `to`: none when the dtypes match.
pub(crate) fn as_dtype_piece(t: &TensorInfo, to: DType) -> (usize, usize) {
    let len = if t.dtype == to { 0 } else { t.numel() };
    (to.size(), len)
}

/// A tensor's data as elements of `to`: its own bytes when the dtypes match, else a
/// converted copy (same layout) in the piece of `scratch` [`as_dtype_piece`] declared.
pub(crate) fn as_dtype<'a>(
    t: &TensorData<'a>,
    to: DType,
    scratch: &mut Scratch<'a>,
) -> KernelResult<&'a [u8]> {
    if t.info.dtype == to {
        return Ok(t.bytes());
    }
    let nbytes = t
        .info
        .numel()
        .checked_mul(to.size())
        .ok_or_else(|| KernelError::invalid("tensor size overflows"))?;
    let buf = scratch.take::<u8>(nbytes)?;
    convert_bytes(t.bytes(), t.info.dtype, buf, to)?;
    Ok(buf)
}

/// Strides for reading a tensor of layout `info` as if broadcast to `sizes` (0 along
/// broadcast dims and new leading dims).
fn broadcast_layout(info: &TensorInfo, sizes: &[usize]) -> KernelResult<Layout> {
    let own = info.strides();
    let rank = info.rank();
    if rank > sizes.len() {
        return Err(KernelError::invalid(format!(
            "cannot broadcast {:?} to {sizes:?}",
            info.sizes.as_slice()
        )));
    }
    let lead = sizes.len() - rank;
    let mut strides: Strides = smallvec::smallvec![0; sizes.len()];
    for i in 0..rank {
        let n = info.sizes[i];
        if n == sizes[lead + i] {
            strides[lead + i] = own[i] as isize;
        } else if n != 1 {
            return Err(KernelError::invalid(format!(
                "cannot broadcast {:?} to {sizes:?}",
                info.sizes.as_slice()
            )));
        }
    }
    Ok(Layout::new(0, strides))
}

/// Copies `src` into `dst`: broadcast to `dst`'s sizes and converted to its dtype (in
/// `scratch`), each tensor in its own dim order (the walk follows `dst`'s memory order).
pub(crate) fn copy_into(
    src: &TensorData<'_>,
    dst: &mut TensorDataMut<'_>,
    scratch: &mut Buffer,
) -> KernelResult {
    let sizes = dst.info.sizes.clone();
    let s = broadcast_layout(&src.info, &sizes)?;
    let d = Layout::of(&dst.info);
    let order = &dst.info.dim_order;
    let walk: SmallVec<[usize; 6]> = order.iter().map(|&k| sizes[k]).collect();
    let s = Layout::new(0, order.iter().map(|&k| s.strides[k]));
    let d = Layout::new(0, order.iter().map(|&k| d.strides[k]));
    let mut scratch = Scratch::new(scratch, &[as_dtype_piece(&src.info, dst.info.dtype)])?;
    let data = as_dtype(src, dst.info.dtype, &mut scratch)?;
    copy(dst.info.dtype.size(), &walk, data, &s, dst.bytes_mut(), &d)
}

/// A scalar as an element of `T` (`is_bool`: as 0/1 for a bool tensor).
pub(crate) fn scalar_as<T: Elem>(v: Scalar, is_bool: bool) -> T {
    if is_bool {
        T::from_i64(i64::from(v.to_bool()))
    } else if T::FLOAT {
        T::from_f64(v.to_f64())
    } else {
        T::from_i64(v.to_i64())
    }
}

/// Sets every element of `dst` to `value`.
pub(crate) fn fill(dst: &mut TensorDataMut<'_>, value: Scalar) -> KernelResult {
    let dtype = dst.info.dtype;
    crate::dispatch_all!(dtype, T => {
        let v = scalar_as::<T>(value, dtype == DType::Bool);
        typed_mut::<T>(dst.bytes_mut())?.fill(v);
        Ok(())
    }, Err(KernelError::dtypes(&[dtype])))
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
}
