//! Reading constant weights and biases into the forms the kernels pack: f32 values
//! (fp32, fp16, bf16, or dequantized 8/4-bit), int8 rows (8-bit weights as stored,
//! uint8 shifted to int8, 4-bit values unpacked and centered), per-channel or per-block
//! scales, int32 biases.

use std::borrow::Cow;

use half::{bf16, f16};

use super::{PResult, PrepareError};
use crate::graph::{Datatype, Quant, Value};

/// The constant bytes of a value, or an error naming what is missing.
pub(crate) fn constant<'a>(v: &'a Value, what: &str) -> PResult<&'a [u8]> {
    v.data.as_ref().map(|c| c.bytes()).ok_or_else(|| {
        PrepareError::Invalid(format!("the {what} (value {}) must be a constant", v.id))
    })
}

fn le4(c: &[u8]) -> [u8; 4] {
    <[u8; 4]>::try_from(c).unwrap_or_default()
}

fn u16s(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| {
        u16::from_le_bytes([
            c.first().copied().unwrap_or(0),
            c.get(1).copied().unwrap_or(0),
        ])
    })
}

/// A float constant as f32 values: read in place when stored as aligned fp32 (upstream
/// aligns named data to 16 bytes), converted otherwise.
pub(crate) fn float_values<'a>(v: &'a Value, what: &str) -> PResult<Cow<'a, [f32]>> {
    let b = constant(v, what)?;
    Ok(match v.dtype {
        Datatype::F32 => match bytemuck::try_cast_slice::<u8, f32>(b) {
            Ok(s) if cfg!(target_endian = "little") => Cow::Borrowed(s),
            _ => Cow::Owned(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(le4(c)))
                    .collect(),
            ),
        },
        Datatype::F16 => Cow::Owned(u16s(b).map(|h| f16::from_bits(h).to_f32()).collect()),
        Datatype::Bf16 => Cow::Owned(u16s(b).map(|h| bf16::from_bits(h).to_f32()).collect()),
        d => return Err(format!("the {what} is {}, not a float type", d.name()).into()),
    })
}

/// 8-bit or 4-bit weights as int8 rows of the last dimension, with the zero point
/// to subtract (uint8 weights are shifted by 128, 4-bit ones centered on 0); int8
/// weights are read in place (a copy of regnet's cost a tenth of its load).
pub(crate) fn int8_values<'a>(v: &'a Value, what: &str) -> PResult<(Cow<'a, [i8]>, i32)> {
    let b = constant(v, what)?;
    Ok(match v.dtype {
        Datatype::QInt8 | Datatype::QcInt8 => {
            let zp = v.per_tensor().map_or(0, |q| q.1);
            (Cow::Borrowed(bytemuck::cast_slice(b)), zp)
        }
        Datatype::QUInt8 => {
            let zp = v.per_tensor().map_or(0, |q| q.1);
            (
                Cow::Owned(b.iter().map(|&x| (x ^ 0x80) as i8).collect()),
                zp - 128,
            )
        }
        Datatype::QcInt4 | Datatype::QbInt4 => {
            // Two values per byte along the last dimension, low nibble first; rows are
            // padded to whole bytes. Stored with zero point 8.
            let cols = v.dims.last().copied().unwrap_or(1);
            let rows = crate::graph::checked_numel(&v.dims)
                .unwrap_or(0)
                .checked_div(cols)
                .unwrap_or(0);
            let stride = cols.div_ceil(2);
            let mut out = Vec::new();
            out.try_reserve_exact(rows * cols)
                .map_err(|_| PrepareError::Invalid("4-bit weights too large".into()))?;
            for r in 0..rows {
                let row = b.get(r * stride..(r + 1) * stride).unwrap_or_default();
                for c in 0..cols {
                    let byte = row.get(c / 2).copied().unwrap_or(0x88);
                    let q = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                    out.push(q as i8 - 8);
                }
            }
            (Cow::Owned(out), 0)
        }
        d => return Err(format!("the {what} is {}, not 8-bit or 4-bit", d.name()).into()),
    })
}

/// The scale of each index of the weight's channel dimension `dim` (`count` of them):
/// per channel, or the per-tensor scale repeated.
pub(crate) fn channel_scales(v: &Value, dim: usize, count: usize, what: &str) -> PResult<Vec<f32>> {
    match &v.quant {
        Quant::PerTensor { scale, .. } => Ok(vec![*scale; count]),
        Quant::PerChannel {
            scales,
            channel_dim,
        } if *channel_dim == dim && scales.len() == count => Ok(scales.clone()),
        Quant::PerChannel { channel_dim, .. } => {
            Err(format!("the {what}'s channel dimension is {channel_dim}, {dim} expected").into())
        }
        _ => Err(format!("the {what} is not per-tensor or per-channel quantized").into()),
    }
}

/// Dequantized float values of 8/4-bit weights quantized per tensor or channel `dim`.
pub(crate) fn dequantized(v: &Value, dim: usize, what: &str) -> PResult<Vec<f32>> {
    let (q, zp) = int8_values(v, what)?;
    let count = v.dims.get(dim).copied().unwrap_or(1);
    let scales = channel_scales(v, dim, count, what)?;
    let inner: usize = v.dims.get(dim + 1..).unwrap_or_default().iter().product();
    Ok(q.iter()
        .enumerate()
        .map(|(i, &x)| {
            let c = i.checked_div(inner).unwrap_or(0) % count.max(1);
            (i32::from(x) - zp) as f32 * scales.get(c).copied().unwrap_or(1.0)
        })
        .collect())
}

/// An int32 bias (qint32 / qcint32) and its scale per output channel.
pub(crate) fn int32_values(v: &Value, what: &str) -> PResult<Vec<i32>> {
    let b = constant(v, what)?;
    if !matches!(
        v.dtype,
        Datatype::QInt32 | Datatype::QcInt32 | Datatype::Int32
    ) {
        return Err(format!("the {what} is {}, not int32", v.dtype.name()).into());
    }
    Ok(b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(le4(c)))
        .collect())
}
