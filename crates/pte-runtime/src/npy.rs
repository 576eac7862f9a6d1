//! `.npy` files to and from [`Tensor`]s and [`EValue`]s (via the `npyz` crate).

use std::io::Read;
use std::path::Path;

use half::f16;
use npyz::WriterBuilder;
use num_complex::Complex;

use crate::dtype::{DType, Element};
use crate::error::{Result, RuntimeError};
use crate::tensor::Tensor;
use crate::value::EValue;

fn io_err(path: &Path, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Reads a `.npy` file (C order, little- or big-endian) into a contiguous tensor.
pub fn read_tensor(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let len = file.metadata().map_err(|e| io_err(path, e))?.len();
    parse_tensor(std::io::BufReader::new(file), len).map_err(|e| io_err(path, e))
}

fn typed<T: Element + npyz::Deserialize, R: Read>(
    npy: npyz::NpyFile<R>,
    shape: &[usize],
) -> std::result::Result<Tensor, String> {
    let v: Vec<T> = npy.into_vec().map_err(|e| e.to_string())?;
    Tensor::from_slice(shape, &v).map_err(|e| e.to_string())
}

/// Parses `.npy` data of at most `available` bytes: a header claiming more elements than
/// that is an error before anything is allocated for them.
fn parse_tensor(reader: impl Read, available: u64) -> std::result::Result<Tensor, String> {
    let npy = npyz::NpyFile::new(reader).map_err(|e| e.to_string())?;
    if npy.order() == npyz::Order::Fortran && npy.shape().len() > 1 {
        return Err(
            "Fortran-ordered arrays are not supported; save with np.ascontiguousarray".into(),
        );
    }
    let shape: Vec<usize> = npy
        .shape()
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| format!("dimension {s} is too large")))
        .collect::<std::result::Result<_, _>>()?;
    let npyz::DType::Plain(ty) = npy.dtype() else {
        return Err("structured arrays are not supported".into());
    };
    let code = ty.to_string();
    let kind = code.get(1..).unwrap_or_default();
    let element: u64 = kind.get(1..).and_then(|n| n.parse().ok()).unwrap_or(1);
    let claimed = shape
        .iter()
        .try_fold(element, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| n <= available);
    if claimed.is_none() {
        return Err(format!(
            "the header claims shape {shape:?} of {kind}, more data than the file's {available} bytes"
        ));
    }
    match kind {
        "f4" => typed::<f32, _>(npy, &shape),
        "f8" => typed::<f64, _>(npy, &shape),
        "f2" => typed::<f16, _>(npy, &shape),
        "i1" => typed::<i8, _>(npy, &shape),
        "i2" => typed::<i16, _>(npy, &shape),
        "i4" => typed::<i32, _>(npy, &shape),
        "i8" => typed::<i64, _>(npy, &shape),
        "u1" => typed::<u8, _>(npy, &shape),
        "u2" => typed::<u16, _>(npy, &shape),
        "u4" => typed::<u32, _>(npy, &shape),
        "u8" => typed::<u64, _>(npy, &shape),
        "c8" => typed::<Complex<f32>, _>(npy, &shape),
        "c16" => typed::<Complex<f64>, _>(npy, &shape),
        "b1" => {
            let v: Vec<bool> = npy.into_vec().map_err(|e| e.to_string())?;
            Tensor::from_bools(&shape, &v).map_err(|e| e.to_string())
        }
        other => Err(format!("numpy dtype {other:?} is not supported")),
    }
}

fn write_typed<T: Element + npyz::AutoSerialize>(
    shape: &[u64],
    values: &[T],
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(out)
        .begin_nd()?;
    w.extend(values.iter().copied())?;
    w.finish()
}

/// The `.npy` bytes of a tensor, in logical (row-major) order whatever its dim order.
pub fn tensor_to_npy(t: &Tensor) -> Result<Vec<u8>> {
    let t = &t.to_contiguous()?;
    let shape: Vec<u64> = t.sizes().iter().map(|&d| d as u64).collect();
    let mut out = Vec::new();
    let err = |e: std::io::Error| RuntimeError::invalid_argument(format!("writing npy: {e}"));
    match t.dtype() {
        DType::F32 => write_typed(&shape, t.as_slice::<f32>()?, &mut out),
        DType::F64 => write_typed(&shape, t.as_slice::<f64>()?, &mut out),
        DType::F16 => write_typed(&shape, t.as_slice::<f16>()?, &mut out),
        DType::I8 => write_typed(&shape, t.as_slice::<i8>()?, &mut out),
        DType::I16 => write_typed(&shape, t.as_slice::<i16>()?, &mut out),
        DType::I32 => write_typed(&shape, t.as_slice::<i32>()?, &mut out),
        DType::I64 => write_typed(&shape, t.as_slice::<i64>()?, &mut out),
        DType::U8 => write_typed(&shape, t.as_slice::<u8>()?, &mut out),
        DType::U16 => write_typed(&shape, t.as_slice::<u16>()?, &mut out),
        DType::U32 => write_typed(&shape, t.as_slice::<u32>()?, &mut out),
        DType::U64 => write_typed(&shape, t.as_slice::<u64>()?, &mut out),
        DType::C64 => write_typed(&shape, t.as_slice::<Complex<f32>>()?, &mut out),
        DType::C128 => write_typed(&shape, t.as_slice::<Complex<f64>>()?, &mut out),
        DType::Bool => {
            let v: Vec<bool> = t.as_bytes().iter().map(|&b| b != 0).collect();
            let mut w = npyz::WriteOptions::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut out)
                .begin_nd()
                .map_err(err)?;
            w.extend(v).map_err(err)?;
            w.finish()
        }
        other => {
            return Err(RuntimeError::invalid_argument(format!(
                "{other} tensors cannot be written as .npy"
            )))
        }
    }
    .map_err(err)?;
    Ok(out)
}

/// Writes an output value as `.npy`: tensors as arrays, scalars as 0-d arrays (int64,
/// float64 or bool).
pub fn write_value(path: impl AsRef<Path>, value: &EValue) -> Result<()> {
    let path = path.as_ref();
    let tensor = match value {
        EValue::Tensor(t) => t.clone(),
        EValue::Int(v) => Tensor::from_slice::<i64>(&[], &[*v])?,
        EValue::Double(v) => Tensor::from_slice::<f64>(&[], &[*v])?,
        EValue::Bool(v) => Tensor::from_bools(&[], &[*v])?,
        other => {
            return Err(RuntimeError::invalid_argument(format!(
                "a {} output cannot be written as .npy",
                other.kind()
            )))
        }
    };
    std::fs::write(path, tensor_to_npy(&tensor)?).map_err(|e| io_err(path, e))
}

/// Reads a method input from `.npy`: an array for tensor inputs, a 0-d (or one-element)
/// array for the int, float and bool inputs the metadata declares. Integers are read
/// exactly, never through a float.
pub fn read_input(path: impl AsRef<Path>, meta: &crate::ValueMeta) -> Result<EValue> {
    let path = path.as_ref();
    let t = read_tensor(path)?;
    if matches!(meta, crate::ValueMeta::Tensor(_)) {
        return Ok(EValue::Tensor(t));
    }
    if t.numel() != 1 {
        return Err(io_err(
            path,
            format!(
                "the input is a {}; expected a single value, got shape {:?}",
                meta.kind(),
                t.sizes()
            ),
        ));
    }
    let not_a = |what: &str| io_err(path, format!("a {} array is not {what}", t.dtype()));
    let int = || -> Option<i64> {
        let b = t.as_bytes();
        Some(match t.dtype() {
            DType::I64 => i64::from_le_bytes(b.try_into().ok()?),
            DType::I32 => i32::from_le_bytes(b.try_into().ok()?).into(),
            DType::I16 => i16::from_le_bytes(b.try_into().ok()?).into(),
            DType::I8 => i8::from_le_bytes(b.try_into().ok()?).into(),
            DType::U8 | DType::Bool => (*b.first()?).into(),
            DType::U16 => u16::from_le_bytes(b.try_into().ok()?).into(),
            DType::U32 => u32::from_le_bytes(b.try_into().ok()?).into(),
            DType::U64 => i64::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok()?,
            _ => return None,
        })
    };
    Ok(match meta {
        crate::ValueMeta::Int(_) => EValue::Int(int().ok_or_else(|| not_a("an integer"))?),
        crate::ValueMeta::Bool(_) => EValue::Bool(int().ok_or_else(|| not_a("a bool"))? != 0),
        crate::ValueMeta::Double(_) => EValue::Double(match t.to_f64_vec()?.first() {
            Some(&v) if t.dtype().is_float() => v,
            _ => return Err(not_a("a float")),
        }),
        other => {
            return Err(io_err(
                path,
                format!("{} inputs cannot be read from .npy", other.kind()),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_round_trip_through_npy() {
        let cases = [
            Tensor::from_slice(&[2, 3], &[1f32, -2.5, 3.0, 4.0, 5.0, 6.0]).unwrap(),
            Tensor::from_slice::<i64>(&[], &[-7]).unwrap(),
            Tensor::from_bools(&[3], &[true, false, true]).unwrap(),
            Tensor::from_slice::<f16>(&[1], &[f16::from_f32(0.5)]).unwrap(),
            Tensor::from_slice::<u8>(&[0, 4], &[]).unwrap(),
            Tensor::from_slice(&[2], &[Complex::new(1f32, -2.0), Complex::new(0.5, 3.0)]).unwrap(),
        ];
        for t in cases {
            let bytes = tensor_to_npy(&t).unwrap();
            let back = parse_tensor(&bytes[..], bytes.len() as u64).unwrap();
            assert_eq!(back.dtype(), t.dtype());
            assert_eq!(back.sizes(), t.sizes());
            assert_eq!(back.as_bytes(), t.as_bytes());
        }
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_tensor(&b"not an npy file"[..], 15).is_err());
        assert!(parse_tensor(&b"\x93NUMPY\x01\x00\xff\xff"[..], 10).is_err());
    }

    #[test]
    fn a_header_claiming_more_data_than_the_file_has_is_an_error() {
        // A valid header for 10^13 float32 elements, followed by 8 bytes of data.
        let mut header =
            "{'descr': '<f4', 'fortran_order': False, 'shape': (9999999999999,), }".to_owned();
        while !(header.len() + 11).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0; 8]);
        let err = parse_tensor(&bytes[..], bytes.len() as u64).unwrap_err();
        assert!(err.contains("more data than"), "{err}");
    }
}
