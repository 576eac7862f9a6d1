//! Fully connected and batch matrix multiply nodes.
//!
//! - float: pte-compute's packed GEMM; constant weights (fp32, fp16, bf16, or 8/4-bit
//!   dequantized for fp32 activations) packed once, bias and clamp in the epilogue;
//!   weights computed at run time are read in place.
//! - static 8-bit (qint8 / quint8 activations, per-tensor or per-channel int8 weights,
//!   int32 bias): int32 products, then XNNPACK's fp32 requantization.
//! - dynamically quantized (qdint8 activations with per-row parameters; per-channel
//!   8-bit or 4-bit, or blockwise 4-bit weights): int32 products per block, scaled to
//!   float per row and channel (and block), plus the float bias.

use pte_compute::conv::Conv2dParams;
use pte_compute::elementwise::Activation;
use pte_compute::gemm::IN_PLACE_WEIGHT_BYTES;
use pte_compute::qconv::{QConvNhwc, QuantParams};
use pte_compute::qgemm::{qgemm, PackedI8, Rows};
use pte_compute::{Bias, Epilogue, Gemm, Lhs, MatMut, MatRef, PackedB, Rhs};
use pte_runtime::Charge;
use std::sync::Arc;

use super::elementwise::row_params;
use super::quant::{self, Q8};
use super::weights::{channel_scales, dequantized, float_values, int32_values, int8_values};
use super::{
    arg, bytes, bytes_mut, describe, f32s, f32s_mut, family, numel, set_shape, shape_of, Family,
    KResult, Kernel, NodeCx, PResult, Prepared,
};
use crate::exec::{Cx, In, Out};
use crate::graph::{Constant, Datatype, Dims, Quant, Value};

/// `(n, k)` of a fully connected filter: `[n, .., k]`, or `[k, n]` transposed.
fn filter_nk(dims: &[usize], transpose: bool) -> PResult<(usize, usize)> {
    if dims.len() < 2 {
        return Err(format!("filter {dims:?} has fewer than 2 dimensions").into());
    }
    let first = dims.first().copied().unwrap_or(0);
    Ok(if transpose {
        (dims.get(1).copied().unwrap_or(0), first)
    } else {
        (first, dims.last().copied().unwrap_or(0))
    })
}

/// Output shape of a fully connected node: the input's, with the last dim `n`.
fn fc_shape(input: &[usize], n: usize, k: usize) -> KResult<(Dims, usize)> {
    let (&last, _) = input.split_last().ok_or("the input is a scalar")?;
    if last != k {
        return Err(format!(
            "input {input:?} does not end in the filter's {k} input channels"
        ));
    }
    let mut out: Dims = input.iter().copied().collect();
    if let Some(l) = out.last_mut() {
        *l = n;
    }
    Ok((out, numel(input) / k.max(1)))
}

/// Charges `bytes` of prepared state to the method's budget.
pub(crate) fn charge(cx: &NodeCx<'_>, bytes: usize) -> PResult<Charge> {
    Ok(cx.budget.charge(bytes as u64)?)
}

enum FloatWeights {
    /// Packed at load: shared by every node of the method's delegates that reads the
    /// same fp32 filter the same way.
    Packed(Arc<PackedFilter>),
    /// A large fp32 filter `[n, k]` read where the file holds it (see
    /// [`in_place_filter`]).
    InPlace(Constant),
    /// Read at run time: transposed (`[k, n]`) or not.
    Dynamic { transpose: bool },
}

enum FloatBias {
    None,
    Const(Vec<f32>),
    Dynamic,
}

/// A filter packed into the layout the product kernel reads, and the memory it is
/// charged for.
struct PackedFilter {
    b: PackedB,
    _charge: Charge,
}

struct FloatFc {
    gemm: Gemm,
    n: usize,
    k: usize,
    m: usize,
    weights: FloatWeights,
    bias: FloatBias,
    min: f32,
    max: f32,
    /// A SiLU fused into the output.
    fused: Option<Activation>,
    _charge: Charge,
}

impl Kernel for FloatFc {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        if let FloatWeights::Dynamic { transpose } = self.weights {
            let (n, k) =
                filter_nk(shape_of(inputs, 1)?, transpose).map_err(|e| format!("{e:?}"))?;
            self.n = n;
            self.k = k;
        }
        let (out, m) = fc_shape(shape_of(inputs, 0)?, self.n, self.k)?;
        self.m = m;
        set_shape(outputs, 0, &out)
    }

    fn scratch_bytes(&self, threads: usize) -> usize {
        let packed = matches!(self.weights, FloatWeights::Packed(_));
        self.gemm
            .scratch_len(self.m, self.n, self.k, false, packed, threads)
            .map_or(usize::MAX / 8, |l| l * 4)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let (m, n, k) = (self.m, self.n, self.k);
        let x = f32s(arg(inputs, 0)?.bytes, m * k)?;
        let dynamic_bias;
        let bias = match &self.bias {
            FloatBias::None => Bias::None,
            FloatBias::Const(b) => Bias::Col(b),
            FloatBias::Dynamic => {
                dynamic_bias = f32s(arg(inputs, 2)?.bytes, n)?;
                Bias::Col(dynamic_bias)
            }
        };
        let rhs = match &self.weights {
            FloatWeights::Packed(p) => Rhs::Packed(&p.b),
            FloatWeights::InPlace(w) => filter_rhs(w.bytes(), (n, k), false)?,
            FloatWeights::Dynamic { transpose } => {
                filter_rhs(arg(inputs, 1)?.bytes, (n, k), *transpose)?
            }
        };
        let out = f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, m * n)?;
        let scratch_len = self
            .gemm
            .scratch_len(
                m,
                n,
                k,
                false,
                matches!(rhs, Rhs::Packed(_)),
                cx.pool.threads(),
            )
            .map_err(|e| e.to_string())?;
        let scratch = cx
            .scratch
            .slice_mut::<f32>(scratch_len)
            .map_err(|e| e.to_string())?;
        let epi = Epilogue {
            accumulate: false,
            bias,
            activation: super::conv::activation(self.min, self.max, self.fused),
        };
        self.gemm
            .run(
                cx.pool,
                MatMut::row_major(out, m, n).map_err(|e| e.to_string())?,
                Lhs::Mat(MatRef::row_major(x, m, k).map_err(|e| e.to_string())?),
                rhs,
                &epi,
                scratch,
            )
            .map_err(|e| e.to_string())
    }
}

/// A filter's f32 bytes as the product's right operand: `[k, n]` transposed, else
/// `[n, k]`.
fn filter_rhs(w: &[u8], (n, k): (usize, usize), transpose: bool) -> KResult<Rhs<'_>> {
    let w = f32s(w, n * k)?;
    let m = if transpose {
        MatRef::row_major(w, k, n)
    } else {
        MatRef::row_major(w, n, k).map(MatRef::t)
    };
    Ok(Rhs::Mat(m.map_err(|e| e.to_string())?))
}

/// A constant fp32 filter stored `[n, k]` in at least [`IN_PLACE_WEIGHT_BYTES`],
/// readable as f32 where it lies: read there at every execution rather than packed,
/// as the plain program's linear layers are (alexnet's classifier: 234 MB).
fn in_place_filter(w: &Value, (n, k): (usize, usize), transpose: bool) -> Option<Constant> {
    let c = w.data.as_ref()?;
    let whole = n.checked_mul(k)?.checked_mul(4)? == c.len();
    let readable = cfg!(target_endian = "little") && f32s(c.bytes(), n * k).is_ok();
    (!transpose
        && w.dtype == Datatype::F32
        && whole
        && c.len() >= IN_PLACE_WEIGHT_BYTES
        && readable)
        .then(|| c.clone())
}

/// The float values of constant weights `[n, .., k]` (or `[k, n]`), dequantized if
/// 8/4-bit.
fn float_filter(w: &Value, transpose: bool) -> PResult<std::borrow::Cow<'_, [f32]>> {
    if w.dtype.is_float() {
        float_values(w, "filter")
    } else {
        let dim = if transpose { 1 } else { 0 };
        dequantized(w, dim, "filter").map(std::borrow::Cow::Owned)
    }
}

fn float_fc(cx: &NodeCx<'_>, transpose: bool) -> PResult<Prepared> {
    let (w, b) = (cx.input(1)?, cx.opt_input(2)?);
    let (min, max) = cx.bounds()?;
    let gemm = Gemm::new();
    let (n, k) = filter_nk(&w.dims, transpose)?;
    let mut captured = Vec::new();
    let in_place = in_place_filter(w, (n, k), transpose);
    // The bias (the packed filter is charged with it, once for the nodes sharing it).
    let held = charge(cx, n.saturating_mul(4))?;
    let reads_in_place = in_place.is_some();
    let weights = if let Some(c) = in_place {
        captured.push(1);
        FloatWeights::InPlace(c)
    } else if let Some(c) = &w.data {
        let pack = || -> PResult<PackedFilter> {
            // Panels padded to whole tiles.
            let charge = charge(cx, n.saturating_add(32).saturating_mul(k).saturating_mul(4))?;
            let v = float_filter(w, transpose)?;
            let b = if transpose {
                MatRef::row_major(&v, k, n).and_then(|m| gemm.pack_b_on(cx.pool, m))
            } else {
                // Stored n × k: packed a slab at a time, the file's pages of each slab
                // given back once it is.
                gemm.pack_bt_on(cx.pool, &v, n, k, &mut |part| {
                    c.release_part(bytemuck::cast_slice(part))
                })
            };
            let b = b.map_err(|e| e.to_string())?;
            Ok(PackedFilter { b, _charge: charge })
        };
        captured.push(1);
        // Only fp32 bytes mean the same values in every node (8/4-bit ones are read with
        // each node's quantization parameters).
        let packed = if w.dtype == Datatype::F32 {
            let variant = (k as u64) << 1 | u64::from(transpose);
            cx.derived
                .get_or_make(c.bytes(), "xnnpack packed fp32 filter", variant, pack)?
        } else {
            Arc::new(pack()?)
        };
        FloatWeights::Packed(packed)
    } else if w.dtype.is_float() {
        FloatWeights::Dynamic { transpose }
    } else {
        return Err(format!(
            "a {} filter computed at run time is not supported",
            w.dtype.name()
        )
        .into());
    };
    let bias = match b {
        None => FloatBias::None,
        Some(b) if b.data.is_some() => {
            let v = float_values(b, "bias")?;
            if v.len() != n {
                return Err(format!("bias of {} values for {n} outputs", v.len()).into());
            }
            captured.push(2);
            FloatBias::Const(v.into_owned())
        }
        Some(b) if b.dtype.is_float() => FloatBias::Dynamic,
        Some(b) => return Err(format!("a {} bias is not supported here", describe(b)).into()),
    };
    let prepared = Prepared::capturing(
        FloatFc {
            gemm,
            n,
            k,
            m: 0,
            weights,
            bias,
            min,
            max,
            fused: cx.node.fused,
            _charge: held,
        },
        &captured,
    )?;
    Ok(if reads_in_place {
        prepared.reading_in_place(1)
    } else {
        prepared
    })
}

/// Static 8-bit fully connected.
/// An 8-bit fully connected node: a 1×1 convolution of pte-compute ([`QConvNhwc`]) over
/// `m` images of one pixel.
struct QuantFc {
    layer: QConvNhwc,
    n: usize,
    k: usize,
    m: usize,
    _charge: Charge,
}

impl Kernel for QuantFc {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let (out, m) = fc_shape(shape_of(inputs, 0)?, self.n, self.k)?;
        self.m = m;
        set_shape(outputs, 0, &out)
    }

    fn scratch_bytes(&self, _threads: usize) -> usize {
        self.layer.scratch_len(self.m).unwrap_or(usize::MAX / 8)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let (m, n, k) = (self.m, self.n, self.k);
        let x = bytes(arg(inputs, 0)?.bytes, m * k)?;
        let out = bytes_mut(outputs.first_mut().ok_or("no output")?.bytes, m * n)?;
        self.layer
            .run(cx.pool, x, m, out, cx.scratch.as_mut_bytes())
            .map_err(|e| e.to_string())
    }
}

/// Requantization scales per output channel: input × weight / output, in f32 as
/// XNNPACK computes them.
pub(crate) fn requant_scales(
    sa: f32,
    w: &Value,
    dim: usize,
    n: usize,
    so: f32,
) -> PResult<Vec<f32>> {
    let sw = channel_scales(w, dim, n, "filter")?;
    Ok(sw.iter().map(|&s| sa * s / so).collect())
}

/// An int32 bias for a quantized node (zeros when absent).
pub(crate) fn quant_bias(b: Option<&Value>, n: usize) -> PResult<Vec<i32>> {
    match b {
        None => Ok(vec![0; n]),
        Some(b) => {
            let v = int32_values(b, "bias")?;
            if v.len() != n {
                return Err(format!("bias of {} values for {n} outputs", v.len()).into());
            }
            Ok(v)
        }
    }
}

fn quant_fc<T: Q8>(cx: &NodeCx<'_>, transpose: bool) -> PResult<Prepared> {
    let (x, w, b, y) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2)?, cx.output(0)?);
    let (min, max) = cx.bounds()?;
    let ((sa, za), (so, zo)) = x
        .per_tensor()
        .zip(y.per_tensor())
        .ok_or("8-bit activations need per-tensor parameters")?;
    if transpose {
        return Err("transposed 8-bit weights are not supported".into());
    }
    let (n, k) = filter_nk(&w.dims, false)?;
    let (wq, zw) = int8_values(w, "filter")?;
    // The weights in panels of 32 outputs, the depth padded to four after up to three
    // copies of each input for a weight zero point, and the bias and scales.
    let copies = if zw != 0 { 3 } else { 1 };
    let packed = n
        .saturating_add(31)
        .saturating_mul(k.saturating_mul(copies).saturating_add(3));
    let charge = charge(cx, packed.saturating_add(n * 16))?;
    let (lo, hi) = quant::bounds::<T>(min, max, so, zo);
    let (bias, scale) = (quant_bias(b, n)?, requant_scales(sa, w, 0, n, so)?);
    let q = QuantParams {
        signed: T::MIN < 0,
        input_zero: za,
        weight_zero: zw,
        bias: &bias,
        scale: &scale,
        output_zero: zo,
        output_min: lo,
        output_max: hi,
    };
    let p = Conv2dParams {
        in_channels: k,
        out_channels: n,
        groups: 1,
        input: [1, 1],
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0; 4],
        dilation: [1, 1],
    };
    let layer = QConvNhwc::new(p, false, &wq, &q).map_err(|e| e.to_string())?;
    // Packed: as for convolutions, the filter's pages go node by node, not all at the
    // end of the delegate's load.
    if let Some(data) = &w.data {
        data.release_pages();
    }
    Prepared::capturing(
        QuantFc {
            layer,
            n,
            k,
            m: 0,
            _charge: charge,
        },
        &[1, 2],
    )
}

/// Fully connected with dynamically quantized activations.
struct DynamicFc {
    w: PackedI8,
    n: usize,
    k: usize,
    m: usize,
    /// Weight scale per output channel and block (`[n][blocks]`).
    scales: Vec<f32>,
    bias: FloatBias,
    min: f32,
    max: f32,
    nonbatch: usize,
    _charge: Charge,
}

impl Kernel for DynamicFc {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        if self.nonbatch != 1 {
            return Err(format!(
                "dynamic quantization over {} dimensions feeding a fully connected node",
                self.nonbatch
            ));
        }
        let (out, m) = fc_shape(s, self.n, self.k)?;
        self.m = m;
        set_shape(outputs, 0, &out)
    }

    fn scratch_bytes(&self, _threads: usize) -> usize {
        self.m * self.n * self.w.blocks() * 4
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let (m, n, k) = (self.m, self.n, self.k);
        let xin = arg(inputs, 0)?;
        let a: &[i8] = bytemuck::cast_slice(bytes(xin.bytes, m * k)?);
        let params = row_params(xin.bytes, m * k, m)?;
        let blocks = self.w.blocks();
        let acc = cx
            .scratch
            .slice_mut::<i32>(m * n * blocks)
            .map_err(|e| e.to_string())?;
        qgemm(
            pte_compute::Isa::best(),
            cx.pool,
            Rows {
                data: a,
                m,
                stride: k,
            },
            &self.w,
            acc,
        )
        .map_err(|e| e.to_string())?;
        let dynamic_bias;
        let bias: Option<&[f32]> = match &self.bias {
            FloatBias::None => None,
            FloatBias::Const(b) => Some(b),
            FloatBias::Dynamic => {
                dynamic_bias = f32s(arg(inputs, 2)?.bytes, n)?;
                Some(dynamic_bias)
            }
        };
        let out = f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, m * n)?;
        let sums = self.w.sums();
        for i in 0..m {
            let [sa, zaf] = params.get(i).copied().unwrap_or([1.0, 0.0]);
            let za = zaf as i32;
            for j in 0..n {
                let mut f = 0f32;
                for bl in 0..blocks {
                    let raw = acc.get((j * m + i) * blocks + bl).copied().unwrap_or(0);
                    let v = raw.wrapping_sub(
                        za.wrapping_mul(sums.get(j * blocks + bl).copied().unwrap_or(0)),
                    );
                    f += v as f32 * self.scales.get(j * blocks + bl).copied().unwrap_or(0.0);
                }
                let r = f * sa + bias.and_then(|b| b.get(j)).copied().unwrap_or(0.0);
                if let Some(o) = out.get_mut(i * n + j) {
                    *o = r.max(self.min).min(self.max);
                }
            }
        }
        Ok(())
    }
}

fn dynamic_fc(cx: &NodeCx<'_>, transpose: bool) -> PResult<Prepared> {
    let (x, w, b, y) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2)?, cx.output(0)?);
    let (min, max) = cx.bounds()?;
    if !y.dtype.is_float() || transpose {
        return Err(format!(
            "dynamically quantized input to {} output (transposed: {transpose})",
            describe(y)
        )
        .into());
    }
    let nonbatch = match x.quant {
        Quant::PerToken { nonbatch_dims } => nonbatch_dims,
        _ => return Err("qdint8 input without per-token parameters".into()),
    };
    let (n, k) = filter_nk(&w.dims, false)?;
    let (wq, _) = int8_values(w, "filter")?;
    let charge = charge(cx, wq.len() + n * 16)?;
    let (packed, scales) = match (&w.dtype, &w.quant) {
        (
            Datatype::QbInt4,
            Quant::Blockwise {
                scales,
                block,
                channel_dim,
            },
        ) => {
            if *channel_dim != 0 {
                return Err("blockwise weights must be per output channel (channel_dim 0)".into());
            }
            (
                PackedI8::with_blocks(&wq, n, k, *block).map_err(|e| e.to_string())?,
                scales.clone(),
            )
        }
        (Datatype::QcInt8 | Datatype::QcInt4, _) => (
            PackedI8::new(&wq, n, k).map_err(|e| e.to_string())?,
            channel_scales(w, 0, n, "filter")?,
        ),
        _ => {
            return Err(format!("dynamically quantized input with a {} filter", describe(w)).into())
        }
    };
    let mut captured = vec![1];
    let bias = match b {
        None => FloatBias::None,
        Some(b) if b.data.is_some() => {
            captured.push(2);
            FloatBias::Const(float_values(b, "bias")?.into_owned())
        }
        Some(b) if b.dtype.is_float() => FloatBias::Dynamic,
        Some(b) => return Err(format!("a {} bias is not supported here", describe(b)).into()),
    };
    Prepared::capturing(
        DynamicFc {
            w: packed,
            n,
            k,
            m: 0,
            scales,
            bias,
            min,
            max,
            nonbatch,
            _charge: charge,
        },
        &captured,
    )
}

/// FullyConnected.
pub(crate) fn fully_connected(cx: &NodeCx<'_>, transpose: bool) -> PResult<Prepared> {
    let (x, w, y) = (cx.input(0)?, cx.input(1)?, cx.output(0)?);
    match (family(x), family(y)) {
        (Family::Float, Family::Float) => float_fc(cx, transpose),
        (Family::QInt8, Family::QInt8) if matches!(w.dtype, Datatype::QInt8 | Datatype::QcInt8) => {
            quant_fc::<i8>(cx, transpose)
        }
        (Family::QUInt8, Family::QUInt8) if w.dtype == Datatype::QUInt8 => {
            quant_fc::<u8>(cx, transpose)
        }
        (Family::Other(Datatype::QdInt8), Family::Float) => dynamic_fc(cx, transpose),
        _ => Err(format!(
            "fully connected {} x {} -> {} is not supported",
            describe(x),
            describe(w),
            describe(y)
        )
        .into()),
    }
}

struct Bmm {
    gemm: Gemm,
    transpose_b: bool,
    /// Output batch dims, and each operand's batch dims padded to the same rank.
    batch: Dims,
    a_batch: Dims,
    b_batch: Dims,
    m: usize,
    k: usize,
    n: usize,
}

impl Kernel for Bmm {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let (a, b) = (shape_of(inputs, 0)?, shape_of(inputs, 1)?);
        if a.len() < 2 || b.len() < 2 {
            return Err(format!(
                "operands {a:?} and {b:?} need at least 2 dimensions"
            ));
        }
        let rank = a.len().max(b.len());
        let pad = |s: &[usize]| -> Dims {
            let mut v: Dims = std::iter::repeat_n(1, rank - s.len()).collect();
            v.extend(s.iter().copied());
            v
        };
        let (pa, pb) = (pad(a), pad(b));
        let at = |s: &Dims, i: usize| s.get(i).copied().unwrap_or(1);
        let (m, k) = (at(&pa, rank - 2), at(&pa, rank - 1));
        let (kb, n) = if self.transpose_b {
            (at(&pb, rank - 1), at(&pb, rank - 2))
        } else {
            (at(&pb, rank - 2), at(&pb, rank - 1))
        };
        if k != kb {
            return Err(format!("inner dimensions of {a:?} and {b:?} differ"));
        }
        let mut batch = Dims::new();
        for i in 0..rank - 2 {
            let (x, y) = (at(&pa, i), at(&pb, i));
            if x != y && x != 1 && y != 1 {
                return Err(format!(
                    "batch dimensions of {a:?} and {b:?} do not broadcast"
                ));
            }
            batch.push(if x == 1 { y } else { x });
        }
        self.a_batch = pa
            .get(..rank - 2)
            .unwrap_or_default()
            .iter()
            .copied()
            .collect();
        self.b_batch = pb
            .get(..rank - 2)
            .unwrap_or_default()
            .iter()
            .copied()
            .collect();
        let mut out = batch.clone();
        out.push(m);
        out.push(n);
        self.batch = batch;
        (self.m, self.k, self.n) = (m, k, n);
        set_shape(outputs, 0, &out)
    }

    fn scratch_bytes(&self, threads: usize) -> usize {
        self.gemm
            .scratch_len(self.m, self.n, self.k, false, false, threads)
            .map_or(usize::MAX / 8, |l| l * 4)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let (m, k, n) = (self.m, self.k, self.n);
        let (ain, bin) = (arg(inputs, 0)?, arg(inputs, 1)?);
        let a = f32s(ain.bytes, numel(ain.dims))?;
        let b = f32s(bin.bytes, numel(bin.dims))?;
        let count = numel(&self.batch);
        let out = f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, count * m * n)?;
        let len = self
            .gemm
            .scratch_len(m, n, k, false, false, cx.pool.threads())
            .map_err(|e| e.to_string())?;
        let scratch = cx
            .scratch
            .slice_mut::<f32>(len)
            .map_err(|e| e.to_string())?;
        let epi = Epilogue::default();
        let mut idx: Dims = std::iter::repeat_n(0, self.batch.len()).collect();
        for (t, c) in out.chunks_exact_mut((m * n).max(1)).enumerate().take(count) {
            let _ = t;
            // Flat offsets of this batch in each operand (broadcast dims stay at 0).
            let off = |dims: &Dims| -> usize {
                idx.iter()
                    .zip(dims)
                    .fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i })
            };
            let (oa, ob) = (off(&self.a_batch) * m * k, off(&self.b_batch) * k * n);
            let am = MatRef::row_major(a.get(oa..oa + m * k).unwrap_or_default(), m, k)
                .map_err(|e| e.to_string())?;
            let bs = b.get(ob..ob + k * n).unwrap_or_default();
            let bm = if self.transpose_b {
                MatRef::row_major(bs, n, k).map(MatRef::t)
            } else {
                MatRef::row_major(bs, k, n)
            }
            .map_err(|e| e.to_string())?;
            self.gemm
                .run(
                    cx.pool,
                    MatMut::row_major(c, m, n).map_err(|e| e.to_string())?,
                    Lhs::Mat(am),
                    Rhs::Mat(bm),
                    &epi,
                    scratch,
                )
                .map_err(|e| e.to_string())?;
            for d in (0..idx.len()).rev() {
                if let (Some(i), Some(&lim)) = (idx.get_mut(d), self.batch.get(d)) {
                    *i += 1;
                    if *i < lim {
                        break;
                    }
                    *i = 0;
                }
            }
        }
        Ok(())
    }
}

/// BatchMatrixMultiply (float).
pub(crate) fn batch_matmul(cx: &NodeCx<'_>, transpose_b: bool) -> PResult<Prepared> {
    let (a, b, y) = (cx.input(0)?, cx.input(1)?, cx.output(0)?);
    if !cx.all_float(&[a, b, y]) {
        return Err(format!(
            "batch matrix multiply of {} and {} is not supported",
            describe(a),
            describe(b)
        )
        .into());
    }
    Prepared::new(Bmm {
        gemm: Gemm::new(),
        transpose_b,
        batch: Dims::new(),
        a_batch: Dims::new(),
        b_batch: Dims::new(),
        m: 0,
        k: 0,
        n: 0,
    })
}
