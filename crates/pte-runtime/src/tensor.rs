//! The owned tensor type that crosses the runtime's API: inputs in, outputs out.

use smallvec::SmallVec;

pub use pte_format::AlignedBuf;

use crate::dtype::{DType, Element};
use crate::error::{Result, RuntimeError};

/// Sizes, strides or a dim order: at most 16 entries, inline up to 6.
pub type Dims = SmallVec<[usize; 6]>;

/// Largest rank the runtime accepts (upstream's `kTensorDimensionLimit`).
pub const MAX_RANK: usize = 16;

/// Strides (in elements) of a dense tensor laid out in `dim_order`.
///
/// A size-0 dimension counts as size 1, as upstream does, so strides stay meaningful.
pub fn strides_for(sizes: &[usize], dim_order: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; sizes.len()];
    let mut step = 1usize;
    for &d in dim_order.iter().rev() {
        if let (Some(stride), Some(&size)) = (strides.get_mut(d), sizes.get(d)) {
            *stride = step;
            step = step.saturating_mul(size.max(1));
        }
    }
    strides
}

/// The identity dim order `0..rank` (contiguous, row-major).
pub fn contiguous_dim_order(rank: usize) -> Dims {
    (0..rank).collect()
}

/// Number of elements, overflow-checked.
pub fn checked_numel(sizes: &[usize]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |a, &s| a.checked_mul(s))
}

/// An owned, dense tensor.
#[derive(Clone, Debug)]
pub struct Tensor {
    dtype: DType,
    sizes: Dims,
    dim_order: Dims,
    data: AlignedBuf,
}

fn alloc_error(e: pte_format::AllocError) -> RuntimeError {
    RuntimeError::invalid_argument(format!("tensor data: {e}"))
}

impl Tensor {
    /// A tensor from raw bytes laid out in `dim_order`; the byte count must match.
    pub fn from_bytes(
        dtype: DType,
        sizes: &[usize],
        dim_order: &[usize],
        bytes: &[u8],
    ) -> Result<Self> {
        let nbytes = Self::check_layout(dtype, sizes, dim_order)?;
        if nbytes != bytes.len() {
            return Err(RuntimeError::invalid_argument(format!(
                "{dtype}{sizes:?} needs {nbytes} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(Tensor {
            dtype,
            sizes: sizes.into(),
            dim_order: dim_order.into(),
            data: AlignedBuf::try_from_bytes(bytes).map_err(alloc_error)?,
        })
    }

    /// A contiguous tensor from elements.
    pub fn from_slice<T: Element>(sizes: &[usize], values: &[T]) -> Result<Self> {
        Self::from_bytes(
            T::DTYPE,
            sizes,
            &contiguous_dim_order(sizes.len()),
            bytemuck::cast_slice(values),
        )
    }

    /// A contiguous bool tensor.
    pub fn from_bools(sizes: &[usize], values: &[bool]) -> Result<Self> {
        let bytes: Vec<u8> = values.iter().map(|&b| u8::from(b)).collect();
        Self::from_bytes(
            DType::Bool,
            sizes,
            &contiguous_dim_order(sizes.len()),
            &bytes,
        )
    }

    /// A zero-filled contiguous tensor.
    pub fn zeros(dtype: DType, sizes: &[usize]) -> Result<Self> {
        Self::zeros_in(dtype, sizes, &contiguous_dim_order(sizes.len()))
    }

    /// A zero-filled tensor laid out in `dim_order`.
    pub fn zeros_in(dtype: DType, sizes: &[usize], dim_order: &[usize]) -> Result<Self> {
        let nbytes = Self::check_layout(dtype, sizes, dim_order)?;
        Ok(Tensor {
            dtype,
            sizes: sizes.into(),
            dim_order: dim_order.into(),
            data: AlignedBuf::try_zeroed(nbytes).map_err(alloc_error)?,
        })
    }

    /// Checks rank and dim order; returns the byte size.
    fn check_layout(dtype: DType, sizes: &[usize], dim_order: &[usize]) -> Result<usize> {
        if sizes.len() > MAX_RANK {
            return Err(RuntimeError::invalid_argument(format!(
                "rank {} exceeds the limit of {MAX_RANK}",
                sizes.len()
            )));
        }
        let mut seen = [false; MAX_RANK];
        let permutation = dim_order.len() == sizes.len()
            && dim_order.iter().all(|&d| {
                d < sizes.len() && seen.get_mut(d).is_some_and(|s| !std::mem::replace(s, true))
            });
        if !permutation {
            return Err(RuntimeError::invalid_argument(format!(
                "dim order {dim_order:?} is not a permutation of 0..{}",
                sizes.len()
            )));
        }
        checked_numel(sizes)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| RuntimeError::invalid_argument("tensor byte size overflows"))
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Sizes in logical order.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Memory order of the dimensions, outermost first.
    pub fn dim_order(&self) -> &[usize] {
        &self.dim_order
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// The raw bytes, in `dim_order` layout.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    fn check_element<T: Element>(&self) -> Result<()> {
        let ok = T::DTYPE == self.dtype || (self.dtype == DType::Bool && T::DTYPE == DType::U8);
        if ok {
            Ok(())
        } else {
            Err(RuntimeError::invalid_argument(format!(
                "tensor holds {}, not {}",
                self.dtype,
                T::DTYPE
            )))
        }
    }

    /// The elements, if `T` is this tensor's element type (`u8` for bool).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_element::<T>()?;
        bytemuck::try_cast_slice(self.data.as_bytes())
            .map_err(|e| RuntimeError::invalid_argument(format!("tensor data: {e}")))
    }

    /// The elements, mutably, if `T` is this tensor's element type (`u8` for bool).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_element::<T>()?;
        bytemuck::try_cast_slice_mut(self.data.as_mut_bytes())
            .map_err(|e| RuntimeError::invalid_argument(format!("tensor data: {e}")))
    }

    /// The same tensor laid out in the default (row-major) dim order.
    pub fn to_contiguous(&self) -> Result<Tensor> {
        if self.dim_order.iter().enumerate().all(|(i, &d)| i == d) {
            return Ok(self.clone());
        }
        let size = self.dtype.size();
        let strides = strides_for(&self.sizes, &self.dim_order);
        let src = self.data.as_bytes();
        let mut out = Tensor::zeros(self.dtype, &self.sizes)?;
        let mut index: Dims = smallvec::smallvec![0; self.sizes.len()];
        for chunk in out.data.as_mut_bytes().chunks_exact_mut(size) {
            let at = index
                .iter()
                .zip(&strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()
                * size;
            let element = src
                .get(at..at + size)
                .ok_or_else(|| RuntimeError::invalid_argument("tensor data is too short"))?;
            chunk.copy_from_slice(element);
            for (i, &n) in index.iter_mut().zip(&self.sizes).rev() {
                *i += 1;
                if *i < n {
                    break;
                }
                *i = 0;
            }
        }
        Ok(out)
    }

    /// Every element converted to f64 (bools as 0/1; complex numbers as their real and
    /// imaginary parts, interleaved), in memory order.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let b = self.as_bytes();
        Ok(match self.dtype {
            DType::F32 => cast::<f32>(b).iter().map(|&v| v.into()).collect(),
            DType::F64 => cast::<f64>(b).to_vec(),
            DType::F16 => cast::<half::f16>(b).iter().map(|v| v.to_f64()).collect(),
            DType::BF16 => cast::<half::bf16>(b).iter().map(|v| v.to_f64()).collect(),
            DType::I8 => cast::<i8>(b).iter().map(|&v| v.into()).collect(),
            DType::I16 => cast::<i16>(b).iter().map(|&v| v.into()).collect(),
            DType::I32 => cast::<i32>(b).iter().map(|&v| v.into()).collect(),
            DType::I64 => cast::<i64>(b).iter().map(|&v| v as f64).collect(),
            DType::U8 | DType::Bool => b.iter().map(|&v| v.into()).collect(),
            DType::U16 => cast::<u16>(b).iter().map(|&v| v.into()).collect(),
            DType::U32 => cast::<u32>(b).iter().map(|&v| v.into()).collect(),
            DType::U64 => cast::<u64>(b).iter().map(|&v| v as f64).collect(),
            DType::C32 => cast::<half::f16>(b).iter().map(|v| v.to_f64()).collect(),
            DType::C64 => cast::<f32>(b).iter().map(|&v| v.into()).collect(),
            DType::C128 => cast::<f64>(b).to_vec(),
            DType::Other(_) => {
                return Err(RuntimeError::invalid_argument(format!(
                    "cannot convert {} to numbers",
                    self.dtype
                )))
            }
        })
    }
}

/// The bytes as `T`s (tensor data is 16-byte aligned; a misfit gives nothing, never a
/// panic).
fn cast<T: bytemuck::Pod>(b: &[u8]) -> &[T] {
    bytemuck::try_cast_slice(b).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_last_becomes_row_major() {
        // Logical [1, 2, 2, 3] (N, C, H, W) stored channels-last: memory order N, H, W, C.
        let logical: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut memory = vec![0f32; 12];
        for c in 0..2 {
            for h in 0..2 {
                for w in 0..3 {
                    memory[(h * 3 + w) * 2 + c] = logical[(c * 2 + h) * 3 + w];
                }
            }
        }
        let t = Tensor::from_bytes(
            DType::F32,
            &[1, 2, 2, 3],
            &[0, 2, 3, 1],
            bytemuck::cast_slice(&memory),
        )
        .unwrap();
        let c = t.to_contiguous().unwrap();
        assert_eq!(c.as_slice::<f32>().unwrap(), logical.as_slice());
        assert_eq!(c.dim_order(), &[0, 1, 2, 3]);
    }
}
