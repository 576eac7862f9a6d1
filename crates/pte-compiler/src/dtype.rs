//! Element types: the archive's numbering, sizes, short names and type promotion.

pub use pte_format::schema::executorch_flatbuffer::ScalarType as DType;

/// The element type for a `ScalarType` code of torch's export schema
/// (`torch/_export/serde/schema.py`, which numbers differently from ExecuTorch).
pub fn from_export_code(code: i64) -> Option<DType> {
    Some(match code {
        1 => DType::Byte,
        2 => DType::Char,
        3 => DType::Short,
        4 => DType::Int,
        5 => DType::Long,
        6 => DType::Half,
        7 => DType::Float,
        8 => DType::Double,
        12 => DType::Bool,
        13 => DType::Bfloat16,
        28 => DType::Uint16,
        29 => DType::Float8e4m3fn,
        30 => DType::Float8e5m2,
        31 => DType::Float8e4m3fnuz,
        32 => DType::Float8e5m2fnuz,
        34 => DType::Uint32,
        35 => DType::Uint64,
        _ => return None,
    })
}

/// Bytes per element.
pub fn size_of(dtype: DType) -> usize {
    pte_format::scalar::element_size(dtype).unwrap_or(1)
}

/// The short name the printed graphs use (`f32`, `i64`, `b8`, ...), as PyTorch prints them.
pub fn short_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Byte => "u8",
        DType::Char => "i8",
        DType::Short => "i16",
        DType::Int => "i32",
        DType::Long => "i64",
        DType::Half => "f16",
        DType::Float => "f32",
        DType::Double => "f64",
        DType::Bool => "b8",
        DType::Bfloat16 => "bf16",
        DType::Uint16 => "u16",
        DType::Uint32 => "u32",
        DType::Uint64 => "u64",
        other => pte_format::scalar::dtype_name(other),
    }
}

/// True for floating-point types.
pub fn is_float(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Half
            | DType::Float
            | DType::Double
            | DType::Bfloat16
            | DType::Float8e4m3fn
            | DType::Float8e5m2
            | DType::Float8e4m3fnuz
            | DType::Float8e5m2fnuz
    )
}

/// The kind of a Python scalar in type promotion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ScalarKind {
    /// `bool`.
    Bool,
    /// `int`.
    Int,
    /// `float`.
    Float,
}

fn category(dtype: DType) -> ScalarKind {
    if dtype == DType::Bool {
        ScalarKind::Bool
    } else if is_float(dtype) {
        ScalarKind::Float
    } else {
        ScalarKind::Int
    }
}

/// The result type of a binary operation between two tensors (PyTorch's promotion for
/// tensors of the same "dimension class").
pub fn promote(a: DType, b: DType) -> DType {
    if a == b {
        return a;
    }
    let (ca, cb) = (category(a), category(b));
    if ca != cb {
        return if ca > cb { a } else { b };
    }
    let rank = |d: DType| match d {
        DType::Bool => 0,
        DType::Byte => 1,
        DType::Char => 2,
        DType::Short => 3,
        DType::Int => 4,
        DType::Long => 5,
        DType::Half | DType::Bfloat16 => 6,
        DType::Float => 7,
        DType::Double => 8,
        _ => 9,
    };
    // Mixed half and bfloat16 (or int8 and uint8) promote upwards, as in PyTorch.
    match (a, b) {
        (DType::Half, DType::Bfloat16) | (DType::Bfloat16, DType::Half) => DType::Float,
        (DType::Byte, DType::Char) | (DType::Char, DType::Byte) => DType::Short,
        _ if rank(a) >= rank(b) => a,
        _ => b,
    }
}

/// The result type of a tensor combined with a Python scalar: the tensor's type unless the
/// scalar is of a higher kind (an int tensor with a float scalar gives the default float
/// type, a bool tensor with an int scalar gives int64).
pub fn promote_with_scalar(tensor: DType, scalar: ScalarKind) -> DType {
    if scalar <= category(tensor) {
        return tensor;
    }
    match scalar {
        ScalarKind::Float => DType::Float,
        ScalarKind::Int => DType::Long,
        ScalarKind::Bool => tensor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        assert_eq!(promote(DType::Float, DType::Long), DType::Float);
        assert_eq!(promote(DType::Int, DType::Long), DType::Long);
        assert_eq!(promote(DType::Bool, DType::Char), DType::Char);
        assert_eq!(promote(DType::Half, DType::Bfloat16), DType::Float);
        assert_eq!(
            promote_with_scalar(DType::Long, ScalarKind::Float),
            DType::Float
        );
        assert_eq!(
            promote_with_scalar(DType::Half, ScalarKind::Float),
            DType::Half
        );
        assert_eq!(
            promote_with_scalar(DType::Bool, ScalarKind::Int),
            DType::Long
        );
        assert_eq!(promote_with_scalar(DType::Int, ScalarKind::Int), DType::Int);
    }
}
