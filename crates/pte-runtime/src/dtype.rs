//! Element types of runtime tensors and the Rust types that hold them.

use half::{bf16, f16};
use num_complex::Complex;
use pte_format::schema::executorch_flatbuffer::ScalarType;

/// The element type of a tensor.
///
/// The runtime computes on the types below; tensors of the other wire types (quantized,
/// float8, packed) can be carried around and copied but kernels reject them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    U8,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
    Bool,
    BF16,
    U16,
    U32,
    U64,
    /// `complex32` (a pair of float16), `complex64`, `complex128`.
    C32,
    C64,
    C128,
    /// A wire type the kernels do not compute on; the name is the PyTorch name.
    Other(ScalarType),
}

impl DType {
    /// The runtime dtype of a wire scalar type.
    pub fn from_scalar_type(s: ScalarType) -> Self {
        match s {
            ScalarType::Byte => DType::U8,
            ScalarType::Char => DType::I8,
            ScalarType::Short => DType::I16,
            ScalarType::Int => DType::I32,
            ScalarType::Long => DType::I64,
            ScalarType::Half => DType::F16,
            ScalarType::Float => DType::F32,
            ScalarType::Double => DType::F64,
            ScalarType::Bool => DType::Bool,
            ScalarType::Bfloat16 => DType::BF16,
            ScalarType::Uint16 => DType::U16,
            ScalarType::Uint32 => DType::U32,
            ScalarType::Uint64 => DType::U64,
            ScalarType::Complex32 => DType::C32,
            ScalarType::Complex64 => DType::C64,
            ScalarType::Complex128 => DType::C128,
            other => DType::Other(other),
        }
    }

    /// The wire scalar type.
    pub fn scalar_type(self) -> ScalarType {
        match self {
            DType::U8 => ScalarType::Byte,
            DType::I8 => ScalarType::Char,
            DType::I16 => ScalarType::Short,
            DType::I32 => ScalarType::Int,
            DType::I64 => ScalarType::Long,
            DType::F16 => ScalarType::Half,
            DType::F32 => ScalarType::Float,
            DType::F64 => ScalarType::Double,
            DType::Bool => ScalarType::Bool,
            DType::BF16 => ScalarType::Bfloat16,
            DType::U16 => ScalarType::Uint16,
            DType::U32 => ScalarType::Uint32,
            DType::U64 => ScalarType::Uint64,
            DType::C32 => ScalarType::Complex32,
            DType::C64 => ScalarType::Complex64,
            DType::C128 => ScalarType::Complex128,
            DType::Other(s) => s,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        pte_format::scalar::element_size(self.scalar_type()).unwrap_or(1)
    }

    /// The PyTorch name (`float32`, `int64`, ...).
    pub fn name(self) -> &'static str {
        pte_format::scalar::dtype_name(self.scalar_type())
    }

    /// Floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64 | DType::BF16)
    }

    /// Complex types.
    pub fn is_complex(self) -> bool {
        matches!(self, DType::C32 | DType::C64 | DType::C128)
    }

    /// Integer types (bool excluded).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::U8
                | DType::I8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U16
                | DType::U32
                | DType::U64
        )
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that holds tensor elements of one dtype. Bool tensors are held as `u8`
/// (0 or 1), since not every byte is a valid `bool`.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype whose elements this type holds.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(u8 => U8, i8 => I8, i16 => I16, i32 => I32, i64 => I64, f16 => F16, f32 => F32,
         f64 => F64, bf16 => BF16, u16 => U16, u32 => U32, u64 => U64,
         Complex<f16> => C32, Complex<f32> => C64, Complex<f64> => C128);
