//! Facts about element types: byte sizes, PyTorch names, and tensor byte counts computed
//! without overflow.

use crate::error::{FormatError, Result};
use crate::schema::executorch_flatbuffer::ScalarType;

/// Bytes per element, or `None` for the packed sub-byte types that have no per-element size.
pub fn element_size(dtype: ScalarType) -> Option<usize> {
    use ScalarType::*;
    Some(match dtype {
        Byte | Char | Bool | Qint8 | Quint8 | Float8e5m2 | Float8e4m3fn | Float8e5m2fnuz
        | Float8e4m3fnuz | Bits1x8 | Bits2x4 | Bits4x2 | Bits8 => 1,
        Short | Half | Bfloat16 | Bits16 | Uint16 => 2,
        Int | Float | Qint32 | Uint32 | Complex32 => 4,
        Long | Double | Uint64 | Complex64 => 8,
        Complex128 => 16,
        Quint4x2 | Quint2x4 => 1,
    })
}

/// The PyTorch name of an element type (`float32`, `int64`, ...).
pub fn dtype_name(dtype: ScalarType) -> &'static str {
    use ScalarType::*;
    match dtype {
        Byte => "uint8",
        Char => "int8",
        Short => "int16",
        Int => "int32",
        Long => "int64",
        Half => "float16",
        Float => "float32",
        Double => "float64",
        Complex32 => "complex32",
        Complex64 => "complex64",
        Complex128 => "complex128",
        Bool => "bool",
        Qint8 => "qint8",
        Quint8 => "quint8",
        Qint32 => "qint32",
        Bfloat16 => "bfloat16",
        Quint4x2 => "quint4x2",
        Quint2x4 => "quint2x4",
        Bits1x8 => "bits1x8",
        Bits2x4 => "bits2x4",
        Bits4x2 => "bits4x2",
        Bits8 => "bits8",
        Bits16 => "bits16",
        Float8e5m2 => "float8_e5m2",
        Float8e4m3fn => "float8_e4m3fn",
        Float8e5m2fnuz => "float8_e5m2fnuz",
        Float8e4m3fnuz => "float8_e4m3fnuz",
        Uint16 => "uint16",
        Uint32 => "uint32",
        Uint64 => "uint64",
    }
}

/// Number of elements of a tensor with these sizes; errors on negative sizes or overflow.
pub fn numel(sizes: impl IntoIterator<Item = i64>, field: &str) -> Result<usize> {
    sizes.into_iter().try_fold(1usize, |acc, s| {
        let s = usize::try_from(s)
            .map_err(|_| FormatError::invalid(field, format!("negative size {s}")))?;
        acc.checked_mul(s)
            .ok_or_else(|| FormatError::overflow(field))
    })
}

/// Byte size of a dense tensor: `numel(sizes) * element_size(dtype)`, overflow-checked.
pub fn tensor_nbytes(
    dtype: ScalarType,
    sizes: impl IntoIterator<Item = i64>,
    field: &str,
) -> Result<usize> {
    let n = numel(sizes, field)?;
    let size = element_size(dtype).unwrap_or(1);
    n.checked_mul(size)
        .ok_or_else(|| FormatError::overflow(field))
}

/// Checks that `dim_order` is a permutation of `0..rank`.
pub fn check_dim_order(dim_order: &[u8], rank: usize, field: &str) -> Result<()> {
    if dim_order.len() != rank {
        return Err(FormatError::invalid(
            field,
            format!("dim_order has {} entries for rank {rank}", dim_order.len()),
        ));
    }
    let mut seen = [false; 256];
    for &d in dim_order {
        let fresh = seen
            .get_mut(usize::from(d))
            .is_some_and(|s| !std::mem::replace(s, true));
        if usize::from(d) >= rank || !fresh {
            return Err(FormatError::invalid(
                field,
                format!("dim_order {dim_order:?} is not a permutation of 0..{rank}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbytes_overflow_is_an_error() {
        let huge = [i64::from(i32::MAX); 4];
        assert!(matches!(
            tensor_nbytes(ScalarType::Double, huge, "t"),
            Err(FormatError::Overflow { .. })
        ));
        assert_eq!(tensor_nbytes(ScalarType::Float, [2, 3], "t").unwrap(), 24);
        assert_eq!(tensor_nbytes(ScalarType::Float, [], "t").unwrap(), 4);
        assert!(tensor_nbytes(ScalarType::Float, [2, -1], "t").is_err());
    }

    #[test]
    fn dim_order_must_be_a_permutation() {
        assert!(check_dim_order(&[0, 2, 3, 1], 4, "t").is_ok());
        assert!(check_dim_order(&[0, 0], 2, "t").is_err());
        assert!(check_dim_order(&[0, 2], 2, "t").is_err());
        assert!(check_dim_order(&[0], 2, "t").is_err());
    }
}
