//! The `quantized_decomposed` family, following the reference formulas of upstream's
//! Python definitions (`torch/ao/quantization/fx/_decomposed.py` and executorch's
//! `_quant_patterns_and_replacements.py`) step by step, each intermediate rounded to
//! the type eager PyTorch computes it in:
//!
//! - quantize: `clamp(round(x · (1 / scale)) + zero_point, quant_min, quant_max)` (per
//!   token: `round(x · (1 / scale) + zero_point)`), rounding half to even, in float32
//!   (float64 when per-channel scales are float64);
//! - dequantize: `(q - zero_point) · scale` in the output's (or the scales') type;
//! - `choose_qparams`: the scale and zero point covering `[min(x, 0), max(x, 0)]`;
//! - 8-, 4- and 2-bit embeddings: rows unpacked (4-bit: high nibble first; 2-bit: low
//!   bits first), dequantized per row or per group of columns, then gathered;
//! - `mixed_mm`, `mixed_linear`: int8 weights dequantized, then multiplied;
//! - `add`: both operands dequantized, added, the sum quantized.

use half::{bf16, f16};
use pte_runtime::{Args, DType, Dims, KernelError, KernelRegistry, KernelResult, Scalar};

use crate::layout::{first_scalar, Dense, Vals};
use crate::num::Elem;
use crate::util::{
    broadcast_shapes, broadcast_strides, for_each_broadcast, oob, prod, same_dtype, Checked,
};

/// Rounds a value to the precision of a float dtype (`f64` values are kept).
fn round_to(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f64::from(v as f32),
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

/// The type a float tensor computes in: float32 for the half types.
fn opmath(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Writes `f(i)` to every element of an output of any real dtype (integers converted
/// as PyTorch's `.to(dtype)`).
fn write(
    dtype: DType,
    bytes: &mut [u8],
    mut f: impl FnMut(usize) -> KernelResult<f64>,
) -> KernelResult {
    crate::dispatch_all!(dtype, T => {
        for (i, o) in crate::layout::typed_mut::<T>(bytes)?.iter_mut().enumerate() {
            *o = T::from_f64(f(i)?);
        }
        Ok(())
    }, Err(KernelError::dtypes(&[dtype])))
}

/// The quantized range `[quant_min, quant_max]`, checked.
fn range(args: &Args<'_>, lo: usize) -> KernelResult<(f64, f64)> {
    let (a, b) = (args.int(lo)?, args.int(lo + 1)?);
    if a > b {
        return Err(KernelError::invalid(format!(
            "quant_min {a} is above quant_max {b}"
        )));
    }
    Ok((a as f64, b as f64))
}

/// One quantization step: `x` times the inverse scale `inv`, rounded half to even, plus
/// the zero point (before rounding when `zero_point_first`, as per-token quantization),
/// clamped; every step rounded to `ct`.
fn quantize(
    x: f64,
    inv: f64,
    zp: f64,
    (lo, hi): (f64, f64),
    ct: DType,
    zero_point_first: bool,
) -> f64 {
    let scaled = round_to(x * inv, ct);
    let v = if zero_point_first {
        round_to(scaled + zp, ct).round_ties_even()
    } else {
        round_to(scaled.round_ties_even() + zp, ct)
    };
    // NaN stays NaN (and converts as PyTorch does).
    if v < lo {
        lo
    } else if v > hi {
        hi
    } else {
        v
    }
}

/// A scalar argument or the one element of a tensor argument.
fn scalar_or_item(args: &Args<'_>, i: usize) -> KernelResult<Scalar> {
    if args.kind(i)? == "Tensor" {
        let t = args.read(i)?;
        if t.info.numel() != 1 {
            return Err(KernelError::invalid(format!(
                "argument {i} must hold one element, got shape {:?}",
                t.info.sizes.as_slice()
            )));
        }
        first_scalar(t.info, t.bytes())
    } else {
        args.scalar(i)
    }
}

/// `quantize_per_tensor.out(input, scale, zero_point, quant_min, quant_max, dtype, out)`
/// and `.Tensor_out` (scale and zero point one-element tensors).
fn quantize_per_tensor(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (scale, zp) = (
        scalar_or_item(args, 1)?.to_f64(),
        scalar_or_item(args, 2)?.to_f64(),
    );
    let bounds = range(args, 3)?;
    if !x.dtype.is_float() {
        return Err(KernelError::dtypes(&[x.dtype]));
    }
    args.resize(6, &x.sizes)?;
    let od = args.info(6)?.dtype;
    let ct = opmath(x.dtype);
    // 1 / scale in Python's double, then cast to the tensor's compute type.
    let inv = round_to(1.0 / scale, ct);
    let mut io = Dense::io(args, &[0.into()], &[6.into()], &[])?;
    let src = Vals::input(&io, 0)?;
    write(od, io.bytes_mut(0)?, |i| {
        Ok(quantize(src.at(i)?, inv, zp, bounds, ct, false))
    })?;
    io.finish()
}

/// `dequantize_per_tensor.out(input, scale, zero_point, quant_min, quant_max, dtype,
/// out_dtype?, out)` and `.Tensor_out`: `(q.to(out) - zero_point) · scale`, each step in
/// the output's type.
fn dequantize_per_tensor(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (scale, zp) = (
        scalar_or_item(args, 1)?.to_f64(),
        scalar_or_item(args, 2)?.to_f64(),
    );
    range(args, 3)?;
    args.resize(7, &x.sizes)?;
    let od = args.info(7)?.dtype;
    if !od.is_float() || x.dtype.is_float() {
        return Err(KernelError::dtypes(&[x.dtype, od]));
    }
    let scale = round_to(scale, opmath(od));
    let mut io = Dense::io(args, &[0.into()], &[7.into()], &[])?;
    let src = Vals::input(&io, 0)?;
    write(od, io.bytes_mut(0)?, |i| {
        let q = round_to(src.at(i)?, od);
        Ok(round_to(round_to(q - zp, od) * scale, od))
    })?;
    io.finish()
}

/// The channel of element `i` of a row-major tensor of `sizes` along `axis`.
fn channel(i: usize, sizes: &[usize], axis: usize) -> usize {
    let inner: usize = sizes.get(axis + 1..).map_or(1, prod);
    let n = sizes.get(axis).copied().unwrap_or(1).max(1);
    i / inner.max(1) % n
}

/// `quantize_per_channel.out(input, scales, zero_points, axis, quant_min, quant_max,
/// dtype, out)`: in float64 when the scales are (PyTorch promotes), else float32.
fn quantize_per_channel(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (s, z) = (args.tensor(1)?, args.tensor(2)?);
    let axis = crate::util::dim_of(&x, args.int(3)?)?;
    let bounds = range(args, 4)?;
    let n = x.sizes.get(axis).copied().ok_or_else(oob)?;
    if !x.dtype.is_float() || !s.dtype.is_float() || s.numel() != n || z.numel() != n {
        return Err(KernelError::invalid(format!(
            "quantize_per_channel: {} input with {} scales and {} zero points for {n} channels",
            x.dtype,
            s.numel(),
            z.numel()
        )));
    }
    args.resize(7, &x.sizes)?;
    let od = args.info(7)?.dtype;
    let ct = if s.dtype == DType::F64 || x.dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let mut io = Dense::io(args, &[0.into(), 1.into(), 2.into()], &[7.into()], &[])?;
    let read = |k: usize| Vals::input(&io, k);
    let (src, scales, zps) = (read(0)?, read(1)?, read(2)?);
    let out = io.outputs.first_mut().ok_or_else(oob)?;
    write(od, out.1, |i| {
        let c = channel(i, &x.sizes, axis);
        let inv = round_to(1.0 / scales.at(c)?, ct);
        Ok(quantize(src.at(i)?, inv, zps.at(c)?, bounds, ct, false))
    })?;
    io.finish()
}

/// `dequantize_per_channel.out(input, scales, zero_points?, axis, quant_min, quant_max,
/// dtype, out_dtype?, out)`: `(q - zero_point) · scale` in the scales' type.
fn dequantize_per_channel(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let s = args.tensor(1)?;
    let z = args.opt_tensor(2)?;
    let axis = crate::util::dim_of(&x, args.int(3)?)?;
    range(args, 4)?;
    let n = x.sizes.get(axis).copied().ok_or_else(oob)?;
    if !s.dtype.is_float() || s.numel() != n || z.as_ref().is_some_and(|z| z.numel() != n) {
        return Err(KernelError::invalid(format!(
            "dequantize_per_channel: {} scales for {n} channels",
            s.numel()
        )));
    }
    args.resize(8, &x.sizes)?;
    let od = args.info(8)?.dtype;
    let reads: &[pte_runtime::Arg] = if z.is_some() {
        &[
            pte_runtime::Arg::At(0),
            pte_runtime::Arg::At(1),
            pte_runtime::Arg::At(2),
        ]
    } else {
        &[pte_runtime::Arg::At(0), pte_runtime::Arg::At(1)]
    };
    let mut io = Dense::io(args, reads, &[8.into()], &[])?;
    let read = |k: usize| Vals::input(&io, k);
    let (src, scales) = (read(0)?, read(1)?);
    let zps = if z.is_some() { Some(read(2)?) } else { None };
    let out = io.outputs.first_mut().ok_or_else(oob)?;
    write(od, out.1, |i| {
        let c = channel(i, &x.sizes, axis);
        let zp = zps.map_or(Ok(0.0), |z| z.at(c))?;
        Ok(round_to(
            round_to(src.at(i)? - zp, s.dtype) * scales.at(c)?,
            s.dtype,
        ))
    })?;
    io.finish()
}

/// `quantize_per_token.out(input, scales, zero_points, quant_min, quant_max, dtype, out)`:
/// each row (the last dim) with its scale and zero point.
fn quantize_per_token(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (s, z) = (args.tensor(1)?, args.tensor(2)?);
    let bounds = range(args, 3)?;
    let row = x.sizes.last().copied().unwrap_or(1).max(1);
    let rows = x.numel() / row;
    if !x.dtype.is_float() || !s.dtype.is_float() || s.numel() != rows || z.numel() != rows {
        return Err(KernelError::invalid(format!(
            "quantize_per_token: {rows} rows, {} scales and {} zero points",
            s.numel(),
            z.numel()
        )));
    }
    args.resize(6, &x.sizes)?;
    let od = args.info(6)?.dtype;
    let ct = if s.dtype == DType::F64 || x.dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let mut io = Dense::io(args, &[0.into(), 1.into(), 2.into()], &[6.into()], &[])?;
    let read = |k: usize| Vals::input(&io, k);
    let (src, scales, zps) = (read(0)?, read(1)?, read(2)?);
    let out = io.outputs.first_mut().ok_or_else(oob)?;
    write(od, out.1, |i| {
        let r = i / row;
        // 1.0 / scales is a tensor op in the scales' type.
        let inv = round_to(round_to(1.0 / scales.at(r)?, s.dtype), ct);
        Ok(quantize(src.at(i)?, inv, zps.at(r)?, bounds, ct, true))
    })?;
    io.finish()
}

/// `dequantize_per_token.out(input, scales, zero_points, quant_min, quant_max, dtype,
/// output_dtype, out)`: `(q - zero_point) · scale` in the scales' type, per row.
fn dequantize_per_token(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (s, z) = (args.tensor(1)?, args.tensor(2)?);
    range(args, 3)?;
    let row = x.sizes.last().copied().unwrap_or(1).max(1);
    let rows = x.numel() / row;
    if !s.dtype.is_float() || s.numel() != rows || z.numel() != rows {
        return Err(KernelError::invalid(format!(
            "dequantize_per_token: {rows} rows, {} scales and {} zero points",
            s.numel(),
            z.numel()
        )));
    }
    args.resize(7, &x.sizes)?;
    let od = args.info(7)?.dtype;
    let mut io = Dense::io(args, &[0.into(), 1.into(), 2.into()], &[7.into()], &[])?;
    let read = |k: usize| Vals::input(&io, k);
    let (src, scales, zps) = (read(0)?, read(1)?, read(2)?);
    let out = io.outputs.first_mut().ok_or_else(oob)?;
    write(od, out.1, |i| {
        let r = i / row;
        let q = src.at(i)? - zps.at(r)?;
        Ok(round_to(q * scales.at(r)?, s.dtype))
    })?;
    io.finish()
}

/// `choose_qparams.Tensor_out(input, quant_min, quant_max, eps, dtype, scale, zero_point)`:
/// the per-tensor affine scale and zero point covering `[min(x, 0), max(x, 0)]` (scale at
/// least `eps`); scale 1 and zero point 0 for an empty input.
fn choose_qparams(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let (qmin, qmax) = range(args, 1)?;
    let eps = args.double(3)?;
    if !x.dtype.is_float() {
        return Err(KernelError::dtypes(&[x.dtype]));
    }
    args.resize(5, &[1])?;
    args.resize(6, &[1])?;
    let ct = x.dtype;
    let (scale, zp) = {
        let t = args.read(0)?;
        let src = Vals::of(t.info, t.bytes())?;
        let mut extremes: Option<(f64, f64)> = None;
        for i in 0..src.len() {
            let v = src.at(i)?;
            extremes = Some(match extremes {
                None => (v, v),
                Some((lo, hi)) => (lo.min(v), hi.max(v)),
            });
        }
        match extremes {
            None => (1.0, 0.0),
            Some((lo, hi)) => {
                let (neg, pos) = (lo.min(0.0), hi.max(0.0));
                // (max - min) / float(qmax - qmin) in the input's type, then at least eps
                // (a float32 tensor).
                let scale = round_to(round_to(pos - neg, ct) / (qmax - qmin), ct);
                let scale = scale.max(round_to(eps, DType::F32));
                let zp = qmin - round_to(neg / scale, opmath(ct)).round_ties_even();
                (scale, zp.clamp(qmin, qmax))
            }
        }
    };
    let mut io = Dense::io(args, &[], &[5.into(), 6.into()], &[])?;
    for (k, v) in [scale, zp].into_iter().enumerate() {
        let dtype = io.outputs.get(k).ok_or_else(oob)?.0.dtype;
        write(dtype, io.bytes_mut(k)?, |_| Ok(v))?;
    }
    io.finish()
}

/// `choose_qparams_per_token_asymmetric.out(input, dtype, scale, zero_point)`: per row
/// (the last dim), int8's range, in float32 (XNNPACK's rule).
fn choose_qparams_per_token(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    if !x.dtype.is_float() {
        return Err(KernelError::dtypes(&[x.dtype]));
    }
    let row = x.sizes.last().copied().unwrap_or(1);
    let mut sizes: Dims = x.sizes.clone();
    match sizes.last_mut() {
        Some(last) => *last = 1,
        None => sizes.push(1),
    }
    args.resize(2, &sizes)?;
    args.resize(3, &sizes)?;
    let ct = opmath(x.dtype);
    let f = |v: f64| round_to(v, ct);
    let (qmin, qmax) = (-128.0, 127.0);
    let mut io = Dense::io(args, &[0.into()], &[2.into(), 3.into()], &[])?;
    let src = Vals::input(&io, 0)?;
    let rows = prod(&sizes);
    let mut params: smallvec::SmallVec<[(f64, f64); 16]> = smallvec::SmallVec::new();
    for r in 0..rows {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for j in 0..row {
            let v = src.at(r * row + j)?;
            lo = lo.min(v);
            hi = hi.max(v);
        }
        let (neg, pos) = (lo.min(0.0), hi.max(0.0));
        let scale = f(f(pos - neg) / (qmax - qmin)).max(f64::from(f32::EPSILON));
        let (dmin, dmax) = (f(neg / scale), f(pos / scale));
        let zp = if f(f(qmin + dmin) + f(qmax + dmax)) > 0.0 {
            f(qmin - dmin)
        } else {
            f(qmax - dmax)
        };
        params.push((scale, zp.clamp(qmin, qmax).round_ties_even()));
    }
    for k in 0..2 {
        let dtype = io.outputs.get(k).ok_or_else(oob)?.0.dtype;
        write(dtype, io.bytes_mut(k)?, |r| {
            let (s, z) = *params.at(r)?;
            Ok(if k == 0 { s } else { z })
        })?;
    }
    io.finish()
}

/// How a quantized embedding packs its values.
#[derive(Clone, Copy)]
enum Packing {
    /// One int8 (or uint8) value per byte.
    Byte,
    /// Two 4-bit values per byte, high nibble first, stored plus 8.
    Nibble,
    /// Four 2-bit values per byte, low bits first, stored plus 2.
    Crumb,
}

impl Packing {
    fn per_byte(self) -> usize {
        match self {
            Packing::Byte => 1,
            Packing::Nibble => 2,
            Packing::Crumb => 4,
        }
    }

    /// Value `j` of the packed row starting at byte `base` of `weights`.
    fn value(self, weights: Vals<'_>, base: usize, j: usize) -> KernelResult<f64> {
        let byte = weights.at(base + j / self.per_byte())?;
        Ok(match self {
            Packing::Byte => byte,
            Packing::Nibble => {
                let b = byte as i64 & 0xff;
                let v = if j.is_multiple_of(2) { b >> 4 } else { b & 15 };
                (v - 8) as f64
            }
            Packing::Crumb => {
                let b = byte as i64 & 0xff;
                (((b >> (2 * (j % 4))) & 3) - 2) as f64
            }
        })
    }
}

/// `embedding_byte/4bit/2bit.out(weight, scales, zero_points?, quant_min, quant_max,
/// indices, out)` and `.dtype_out` (the output dtype at 6): the rows `indices` name,
/// dequantized per row or per group of columns (`(q - zero_point) · scale` in the scales'
/// type, then converted to the output's).
fn embedding(args: &mut Args<'_>, packing: Packing, out: usize) -> KernelResult {
    let (w, s) = (args.tensor(0)?, args.tensor(1)?);
    let z = args.opt_tensor(2)?;
    let idx = args.info(5)?;
    let (rows, packed) = match w.sizes.as_slice() {
        &[r, c] if matches!(w.dtype, DType::I8 | DType::U8) => (r, c),
        s => {
            return Err(KernelError::invalid(format!(
                "quantized embedding weights must be 2-d int8 or uint8, got {} {s:?}",
                w.dtype
            )))
        }
    };
    let cols = packed * packing.per_byte();
    let groups = match s.sizes.as_slice() {
        &[r] if r == rows => 1,
        &[r, g] if r == rows && g > 0 && cols.is_multiple_of(g) => g,
        sz => {
            return Err(KernelError::invalid(format!(
                "embedding scales {sz:?} do not fit {rows} rows of {cols} values"
            )))
        }
    };
    if !s.dtype.is_float() || z.as_ref().is_some_and(|z| z.numel() != s.numel()) {
        return Err(KernelError::invalid(
            "embedding zero points must match the scales",
        ));
    }
    if !matches!(idx.dtype, DType::I64 | DType::I32) {
        return Err(KernelError::dtypes(&[idx.dtype]));
    }
    let group = cols / groups;
    let mut sizes = idx.sizes.clone();
    sizes.push(cols);
    crate::util::numel_of(&sizes)?;
    args.resize(out, &sizes)?;
    let od = args.info(out)?.dtype;
    let reads: &[pte_runtime::Arg] = if z.is_some() {
        &[0.into(), 1.into(), 5.into(), 2.into()]
    } else {
        &[0.into(), 1.into(), 5.into()]
    };
    let mut io = Dense::io(args, reads, &[out.into()], &[])?;
    let read = |k: usize| Vals::input(&io, k);
    let (weights, scales, indices) = (read(0)?, read(1)?, read(2)?);
    let zps = if z.is_some() { Some(read(3)?) } else { None };
    let target = io.outputs.first_mut().ok_or_else(oob)?;
    write(od, target.1, |i| {
        let (k, j) = (i / cols.max(1), i % cols.max(1));
        let r = indices.at(k)?;
        let r = usize::try_from(r as i64)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| {
                KernelError::invalid(format!(
                    "embedding index {r} is out of range for {rows} rows"
                ))
            })?;
        let q = packing.value(weights, r * packed, j)?;
        let g = r * groups + j / group;
        let v = match zps {
            Some(z) => round_to(round_to(q - z.at(g)?, s.dtype) * scales.at(g)?, s.dtype),
            None => round_to(q * scales.at(g)?, s.dtype),
        };
        Ok(v)
    })?;
    io.finish()
}

/// `mixed_mm.out(input, weight, weight_scales, weight_zero_points?, out)`: `input [m, k]`
/// times an int8 `weight [k, n]` dequantized per row `k` in the input's type.
fn mixed_mm(args: &mut Args<'_>) -> KernelResult {
    mixed(args, false)
}

/// `mixed_linear.out(input, weight, weight_scales, weight_zero_points?, dtype?, out)`:
/// `input [..., k]` times the transpose of an int8 `weight [n, k]` dequantized per row
/// (or per group of columns) in float32, the result in the output's type.
fn mixed_linear(args: &mut Args<'_>) -> KernelResult {
    mixed(args, true)
}

fn mixed(args: &mut Args<'_>, linear: bool) -> KernelResult {
    let (x, w, s) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let z = args.opt_tensor(3)?;
    let out = if linear { 5 } else { 4 };
    let (&k, lead) = x
        .sizes
        .split_last()
        .ok_or_else(|| KernelError::invalid("mixed products need a matrix input"))?;
    let (n, wk) = match (w.sizes.as_slice(), linear) {
        (&[n, wk], true) => (n, wk),
        (&[wk, n], false) => (n, wk),
        (sz, _) => {
            return Err(KernelError::invalid(format!(
                "mixed products need 2-d weights, got {sz:?}"
            )))
        }
    };
    let rows_of_scales = if linear { n } else { k };
    let groups = match s.sizes.as_slice() {
        &[r] if r == rows_of_scales => 1,
        &[r, g] if linear && r == n && g > 0 && k.is_multiple_of(g) => g,
        sz => {
            return Err(KernelError::invalid(format!(
                "mixed product scales {sz:?} do not fit the weight"
            )))
        }
    };
    if wk != k || !x.dtype.is_float() || (!linear && lead.len() != 1) {
        return Err(KernelError::invalid(format!(
            "mixed product of {:?} and {:?}",
            x.sizes.as_slice(),
            w.sizes.as_slice()
        )));
    }
    let mut sizes: Dims = lead.into();
    sizes.push(n);
    args.resize(out, &sizes)?;
    let od = args.info(out)?.dtype;
    // The weight dequantizes in float32 for mixed_linear, in the input's type for mixed_mm.
    let wt = if linear { DType::F32 } else { x.dtype };
    let reads: &[pte_runtime::Arg] = if z.is_some() {
        &[0.into(), 1.into(), 2.into(), 3.into()]
    } else {
        &[0.into(), 1.into(), 2.into()]
    };
    let mut io = Dense::io(args, reads, &[out.into()], &[])?;
    let read = |k: usize| Vals::input(&io, k);
    let (xs, ws, ss) = (read(0)?, read(1)?, read(2)?);
    let zs = if z.is_some() { Some(read(3)?) } else { None };
    let group = k / groups;
    let weight = |kk: usize, j: usize| -> KernelResult<f64> {
        let (at, g) = if linear {
            (j * k + kk, j * groups + kk / group)
        } else {
            (kk * n + j, kk)
        };
        let q = round_to(ws.at(at)?, wt);
        let (sc, zp) = (round_to(ss.at(g)?, wt), zs.map_or(Ok(0.0), |z| z.at(g))?);
        Ok(round_to(round_to(q - round_to(zp, wt), wt) * sc, wt))
    };
    let target = io.outputs.first_mut().ok_or_else(oob)?;
    write(od, target.1, |i| {
        let (r, j) = (i / n.max(1), i % n.max(1));
        let mut acc = 0.0;
        for kk in 0..k {
            acc += xs.at(r * k + kk)? * weight(kk, j)?;
        }
        Ok(acc)
    })?;
    io.finish()
}

/// `add.out(a, a_scale, a_zero_point, a_min, a_max, b, b_scale, b_zero_point, b_min,
/// b_max, out_scale, out_zero_point, out_min, out_max, out)`: both dequantized (float32),
/// added, and quantized with the output's parameters; `a` and `b` broadcast.
fn quantized_add(args: &mut Args<'_>) -> KernelResult {
    let (a, b) = (args.tensor(0)?, args.tensor(5)?);
    let (sa, za) = (args.double(1)?, args.int(2)? as f64);
    let (sb, zb) = (args.double(6)?, args.int(7)? as f64);
    let (so, zo) = (args.double(10)?, args.int(11)? as f64);
    range(args, 3)?;
    range(args, 8)?;
    let bounds = range(args, 12)?;
    same_dtype(a.dtype, b.dtype)?;
    let sizes = broadcast_shapes(&a.sizes, &b.sizes)?;
    args.resize(14, &sizes)?;
    let od = args.info(14)?.dtype;
    let ct = DType::F32;
    let (sa, sb) = (round_to(sa, ct), round_to(sb, ct));
    let inv = round_to(1.0 / so, ct);
    let (st_a, st_b) = (
        broadcast_strides(&a.sizes, &sizes),
        broadcast_strides(&b.sizes, &sizes),
    );
    let mut io = Dense::io(args, &[0.into(), 5.into()], &[14.into()], &[])?;
    let read = |k: usize| Vals::input(&io, k);
    let (xa, xb) = (read(0)?, read(1)?);
    let value = |i: usize, j: usize| -> KernelResult<f64> {
        let x = round_to(round_to(xa.at(i)? - za, ct) * sa, ct);
        let y = round_to(round_to(xb.at(j)? - zb, ct) * sb, ct);
        Ok(quantize(round_to(x + y, ct), inv, zo, bounds, ct, false))
    };
    let target = io.outputs.first_mut().ok_or_else(oob)?;
    crate::dispatch_all!(od, T => {
        let mut out = crate::layout::typed_mut::<T>(target.1)?.iter_mut();
        let mut result = Ok(());
        for_each_broadcast(&sizes, [&st_a, &st_b], |_, [i, j]| {
            match (out.next(), value(i, j)) {
                (Some(o), Ok(v)) => *o = T::from_f64(v),
                (None, _) => result = Err(oob()),
                (_, Err(e)) => result = Err(e),
            }
        });
        result?;
    }, return Err(KernelError::dtypes(&[od])));
    io.finish()
}

/// Registers the quantized kernels.
pub fn register(r: &mut KernelRegistry) {
    let q = |name: &str| format!("quantized_decomposed::{name}");
    r.register_fn(&q("quantize_per_tensor.out"), quantize_per_tensor);
    r.register_fn(&q("quantize_per_tensor.Tensor_out"), quantize_per_tensor);
    r.register_fn(&q("dequantize_per_tensor.out"), dequantize_per_tensor);
    r.register_fn(
        &q("dequantize_per_tensor.Tensor_out"),
        dequantize_per_tensor,
    );
    r.register_fn(&q("quantize_per_channel.out"), quantize_per_channel);
    r.register_fn(&q("dequantize_per_channel.out"), dequantize_per_channel);
    r.register_fn(&q("quantize_per_token.out"), quantize_per_token);
    r.register_fn(&q("dequantize_per_token.out"), dequantize_per_token);
    r.register_fn(&q("choose_qparams.Tensor_out"), choose_qparams);
    r.register_fn(
        &q("choose_qparams_per_token_asymmetric.out"),
        choose_qparams_per_token,
    );
    r.register_fn(&q("embedding_byte.out"), |a| embedding(a, Packing::Byte, 6));
    r.register_fn(&q("embedding_byte.dtype_out"), |a| {
        embedding(a, Packing::Byte, 7)
    });
    r.register_fn(&q("embedding_4bit.out"), |a| {
        embedding(a, Packing::Nibble, 6)
    });
    r.register_fn(&q("embedding_4bit.dtype_out"), |a| {
        embedding(a, Packing::Nibble, 7)
    });
    r.register_fn(&q("embedding_2bit.out"), |a| {
        embedding(a, Packing::Crumb, 6)
    });
    r.register_fn(&q("embedding_2bit.dtype_out"), |a| {
        embedding(a, Packing::Crumb, 7)
    });
    r.register_fn(&q("mixed_mm.out"), mixed_mm);
    r.register_fn(&q("mixed_linear.out"), mixed_linear);
    r.register_fn(&q("add.out"), quantized_add);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_rounds_half_to_even_and_clamps() {
        let q = |x: f64| quantize(x, 2.0, 3.0, (-128.0, 127.0), DType::F32, false);
        // x / 0.5 = -2.5, 1.5, 0.5: halves to even, then plus 3.
        assert_eq!(q(-1.25), 1.0);
        assert_eq!(q(0.75), 5.0);
        assert_eq!(q(0.25), 3.0);
        assert_eq!(q(100.0), 127.0);
        assert!(q(f64::NAN).is_nan());
    }

    #[test]
    fn packed_values_unpack_in_upstream_order() {
        let row = [0x4bu8];
        let row = Vals::U8(&row);
        assert_eq!(Packing::Nibble.value(row, 0, 0).unwrap(), 4.0 - 8.0);
        assert_eq!(Packing::Nibble.value(row, 0, 1).unwrap(), 11.0 - 8.0);
        let crumbs: Vec<f64> = (0..4)
            .map(|j| Packing::Crumb.value(row, 0, j).unwrap())
            .collect();
        // 0x4b = 01 00 10 11: low bits first.
        assert_eq!(crumbs, [1.0, 0.0, -2.0, -1.0]);
    }
}
