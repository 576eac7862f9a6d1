//! Convolution nodes (regular, depthwise, transposed) over NHWC images.
//!
//! Float convolutions run pte-compute's prepared NHWC layers (weights packed once).
//! 8-bit convolutions gather each output pixel's receptive field as int8 (taps outside
//! the image take the input zero point, so they add nothing once the zero point is
//! folded out), multiply with int32 accumulation, and requantize per output channel
//! the way XNNPACK's fp32 kernels do; depthwise ones accumulate per channel directly.

use std::borrow::Cow;
use std::sync::Arc;

use pte_compute::nhwc::{ConvNhwc, ConvWeights, DeconvNhwc, Geometry};
use pte_compute::qgemm::{qgemm, PackedI8, Rows};
use pte_compute::{Activation, Gemm, ThreadPool};
use pte_runtime::Charge;

use super::linear::{charge, quant_bias, requant_scales};
use super::quant::{self, Requant, Q8};
use super::weights::{float_values, int8_values};
use super::{
    arg, bytes, bytes_mut, describe, f32s, f32s_mut, family, numel, set_shape, shape_of, Family,
    KResult, Kernel, NodeCx, PResult, Prepared,
};
use crate::exec::{Cx, In, Out};
use crate::graph::{ConvGeometry, Dims, Value};

/// Regular or depthwise.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Regular,
    Depthwise,
}

fn u(v: u32) -> usize {
    v as usize
}

fn geometry(g: &ConvGeometry, input: [usize; 2]) -> Geometry {
    Geometry {
        input,
        kernel: [u(g.kernel[0]), u(g.kernel[1])],
        stride: [u(g.stride[0]), u(g.stride[1])],
        dilation: [u(g.dilation[0]), u(g.dilation[1])],
        padding: g.padding.map(u),
    }
}

/// `[n, h, w, c]` of an NHWC input, checked against the expected channels.
fn input_nhwc(s: &[usize], channels: usize) -> KResult<[usize; 4]> {
    match *s {
        [n, h, w, c] if c == channels => Ok([n, h, w, c]),
        _ => Err(format!("input {s:?} is not NHWC with {channels} channels")),
    }
}

/// Channel counts: (groups, input per group, output per group, input, output), with
/// the filter's dims checked.
fn channels(
    g: &ConvGeometry,
    kind: Kind,
    filter: &Value,
) -> PResult<(usize, usize, usize, usize, usize)> {
    let (groups, cig, cog) = (
        u(g.groups),
        u(g.group_input_channels),
        u(g.group_output_channels),
    );
    let [kh, kw] = g.kernel.map(u);
    if groups == 0 || cig == 0 || cog == 0 || kh == 0 || kw == 0 {
        return Err(format!(
            "groups {groups}, channels {cig}/{cog} and kernel {kh}x{kw} must be positive"
        )
        .into());
    }
    if g.stride.contains(&0) || g.dilation.contains(&0) {
        return Err(format!(
            "stride {:?} and dilation {:?} must be positive",
            g.stride, g.dilation
        )
        .into());
    }
    let (cin, cout) = match kind {
        // XNNPACK's depthwise: `groups` input channels, `cog / cig` outputs each.
        Kind::Depthwise => {
            if cog % cig != 0 {
                return Err(
                    format!("depthwise output channels {cog} are not a multiple of {cig}").into(),
                );
            }
            let mult = cog / cig;
            let cout = groups.checked_mul(mult).ok_or("channel count overflows")?;
            let want = [1, kh, kw, cout];
            if filter.dims.as_slice() != want {
                return Err(
                    format!("depthwise filter {:?}, expected {want:?}", filter.dims).into(),
                );
            }
            (groups, cout)
        }
        Kind::Regular => {
            let cout = groups.checked_mul(cog).ok_or("channel count overflows")?;
            let want = [cout, kh, kw, cig];
            if filter.dims.as_slice() != want {
                return Err(format!("filter {:?}, expected {want:?}", filter.dims).into());
            }
            (
                groups.checked_mul(cig).ok_or("channel count overflows")?,
                cout,
            )
        }
    };
    Ok((groups, cig, cog, cin, cout))
}

struct FloatConv {
    g: ConvGeometry,
    kind: Kind,
    /// The constant filter and bias, read again whenever the layer is (re)built for an
    /// input size.
    filter: Value,
    bias: Option<Value>,
    min: f32,
    max: f32,
    cin: usize,
    cout: usize,
    layer: Option<(ConvNhwc, [usize; 2])>,
    /// A SiLU fused into the output.
    silu: bool,
    /// The method's threads, to pack the weights on.
    pool: Arc<ThreadPool>,
    _charge: Charge,
}

/// Float values read in place when they can be, converted otherwise.
type Floats<'a> = Cow<'a, [f32]>;

/// The float values of a constant filter (dequantized if 8/4-bit) and bias.
fn float_filter<'a>(
    filter: &'a Value,
    bias: Option<&'a Value>,
    dim: usize,
) -> KResult<(Floats<'a>, Option<Floats<'a>>)> {
    let w = if filter.dtype.is_float() {
        float_values(filter, "filter")
    } else {
        super::weights::dequantized(filter, dim, "filter").map(Cow::Owned)
    }
    .map_err(|e| format!("{e:?}"))?;
    let b = bias
        .map(|b| float_values(b, "bias"))
        .transpose()
        .map_err(|e| format!("{e:?}"))?;
    Ok((w, b))
}

impl FloatConv {
    fn build(&self, h: usize, w: usize) -> KResult<ConvNhwc> {
        let geo = geometry(&self.g, [h, w]);
        let (groups, cig, cog) = match self.kind {
            Kind::Depthwise => (self.cin, 1, self.cout / self.cin.max(1)),
            Kind::Regular => (
                u(self.g.groups),
                u(self.g.group_input_channels),
                u(self.g.group_output_channels),
            ),
        };
        let dim = if self.kind == Kind::Depthwise { 3 } else { 0 };
        let (weights, bias) = float_filter(&self.filter, self.bias.as_ref(), dim)?;
        let weights = match self.kind {
            Kind::Depthwise => ConvWeights::hwo(&weights),
            Kind::Regular => ConvWeights::ohwi(&weights),
        };
        ConvNhwc::new(
            &self.pool,
            Gemm::new(),
            geo.conv2d(groups * cig, groups * cog, groups),
            weights,
            bias.as_deref(),
            activation(self.min, self.max, self.silu),
        )
        .map_err(|e| e.to_string())
    }
}

/// The activation of a float layer: its output bounds, or a fused SiLU.
pub(crate) fn activation(min: f32, max: f32, silu: bool) -> Activation {
    if silu {
        Activation::Silu
    } else if min == f32::NEG_INFINITY && max == f32::INFINITY {
        Activation::Identity
    } else {
        Activation::Clamp { min, max }
    }
}

impl Kernel for FloatConv {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let [n, h, w, _] = input_nhwc(shape_of(inputs, 0)?, self.cin)?;
        if self.layer.as_ref().map(|(_, s)| *s) != Some([h, w]) {
            let layer = self.build(h, w)?;
            self.layer = Some((layer, [h, w]));
        }
        let (layer, _) = self.layer.as_ref().ok_or("no layer")?;
        let [oh, ow] = layer.output_size();
        set_shape(outputs, 0, &[n, oh, ow, self.cout])
    }

    fn scratch_bytes(&self, threads: usize) -> usize {
        self.layer.as_ref().map_or(0, |(l, _)| {
            l.scratch_len(threads).map_or(usize::MAX / 8, |s| s * 4)
        })
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let (layer, _) = self.layer.as_ref().ok_or("not reshaped")?;
        let n = x.dims.first().copied().unwrap_or(0);
        let (xl, yl) = layer.io_len(n).map_err(|e| e.to_string())?;
        let len = layer
            .scratch_len(cx.pool.threads())
            .map_err(|e| e.to_string())?;
        let scratch = cx
            .scratch
            .slice_mut::<f32>(len)
            .map_err(|e| e.to_string())?;
        layer
            .run(
                cx.pool,
                f32s(x.bytes, xl)?,
                n,
                None,
                f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, yl)?,
                scratch,
            )
            .map_err(|e| e.to_string())
    }
}

/// Conv2d and DepthwiseConv2d.
pub(crate) fn convolution(cx: &NodeCx<'_>, g: &ConvGeometry, kind: Kind) -> PResult<Prepared> {
    let (x, w, b, y) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2)?, cx.output(0)?);
    let (min, max) = cx.bounds()?;
    if cx.node.flags != 0 {
        return Err(format!("unsupported flags {:#x}", cx.node.flags).into());
    }
    let (_, _, _, cin, cout) = channels(g, kind, w)?;
    if w.data.is_none() || b.is_some_and(|b| b.data.is_none()) {
        return Err("convolution weights and bias must be constants".into());
    }
    match (family(x), family(y)) {
        (Family::Float, Family::Float) => {
            if b.is_some_and(|b| b.dims.as_slice() != [cout]) {
                return Err(format!(
                    "bias dims {:?} for {cout} channels",
                    b.map(|b| b.dims.clone())
                )
                .into());
            }
            // The packed weights (panels padded to whole tiles) and the bias.
            let k = (crate::graph::checked_numel(&w.dims).unwrap_or(0) / cout.max(1)).max(1);
            let charge = charge(
                cx,
                cout.saturating_add(32)
                    .saturating_mul(k)
                    .saturating_mul(4)
                    .saturating_add(cout * 4),
            )?;
            Prepared::capturing(
                FloatConv {
                    g: *g,
                    kind,
                    filter: w.clone(),
                    bias: b.cloned(),
                    min,
                    max,
                    cin,
                    cout,
                    layer: None,
                    silu: cx.node.fused_silu,
                    pool: cx.pool.clone(),
                    _charge: charge,
                },
                &[1, 2],
            )
        }
        (Family::QInt8, Family::QInt8) => quant_conv::<i8>(cx, g, kind, cin, cout),
        (Family::QUInt8, Family::QUInt8) => quant_conv::<u8>(cx, g, kind, cin, cout),
        _ => Err(format!(
            "convolution {} x {} -> {} is not supported",
            describe(x),
            describe(w),
            describe(y)
        )
        .into()),
    }
}

/// 8-bit convolution (regular or depthwise).
struct QuantConv<T> {
    g: ConvGeometry,
    kind: Kind,
    groups: usize,
    cig: usize,
    cog: usize,
    cin: usize,
    cout: usize,
    /// Regular: one packed matrix per group. Depthwise: weights `[taps][cout]`.
    packed: Vec<PackedI8>,
    dw: Vec<i8>,
    za: i32,
    zw: i32,
    bias: Vec<i32>,
    scales: Vec<f32>,
    requant: Requant,
    geo: Option<Geometry>,
    m: usize,
    _charge: Charge,
    _t: std::marker::PhantomData<T>,
}

impl<T: Q8> Kernel for QuantConv<T> {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let [n, h, w, _] = input_nhwc(shape_of(inputs, 0)?, self.cin)?;
        let geo = geometry(&self.g, [h, w]);
        let [oh, ow] = geo.output().map_err(|e| e.to_string())?;
        self.geo = Some(geo);
        self.m = n * oh * ow;
        set_shape(outputs, 0, &[n, oh, ow, self.cout])
    }

    fn scratch_bytes(&self, _threads: usize) -> usize {
        match self.kind {
            Kind::Depthwise => 0,
            Kind::Regular => {
                let k = u(self.g.kernel[0]) * u(self.g.kernel[1]) * self.cig;
                self.m * k + self.m * self.cog * 4 + 64
            }
        }
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let geo = self.geo.as_ref().ok_or("not reshaped")?;
        let [n, h, w, _] = input_nhwc(x.dims, self.cin)?;
        let [oh, ow] = geo.output().map_err(|e| e.to_string())?;
        let src: &[T] = bytemuck::cast_slice(bytes(x.bytes, n * h * w * self.cin)?);
        let out: &mut [T] = bytemuck::cast_slice_mut(bytes_mut(
            outputs.first_mut().ok_or("no output")?.bytes,
            self.m * self.cout,
        )?);
        let [kh, kw] = geo.kernel;
        // Int8 views of the activations: uint8 shifted by 128.
        let shift = if T::MIN == 0 { 128 } else { 0 };
        let za = self.za - shift;
        let to_i8 = |v: T| (v.get() - shift) as i8;
        match self.kind {
            Kind::Depthwise => {
                let mult = self.cout / self.cin.max(1);
                for b in 0..n {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let o = ((b * oh + oy) * ow + ox) * self.cout;
                            for c in 0..self.cout {
                                let mut acc = self.bias.get(c).copied().unwrap_or(0);
                                for t in 0..kh * kw {
                                    let Some((iy, ix)) = geo.source(oy, ox, t / kw, t % kw) else {
                                        continue;
                                    };
                                    let xv = src
                                        .get(((b * h + iy) * w + ix) * self.cin + c / mult)
                                        .map_or(0, |&v| i32::from(to_i8(v)));
                                    let wv =
                                        self.dw.get(t * self.cout + c).map_or(0, |&v| i32::from(v));
                                    acc = acc.wrapping_add((xv - za).wrapping_mul(wv - self.zw));
                                }
                                if let Some(d) = out.get_mut(o + c) {
                                    *d = T::from_i32(
                                        self.requant
                                            .apply(acc, self.scales.get(c).copied().unwrap_or(0.0)),
                                    );
                                }
                            }
                        }
                    }
                }
            }
            Kind::Regular => {
                let k = kh * kw * self.cig;
                let m = self.m;
                let scratch = cx.scratch.as_mut_bytes();
                let (cols, rest) = scratch
                    .split_at_mut_checked(m * k)
                    .ok_or("scratch too small")?;
                let cols: &mut [i8] = bytemuck::cast_slice_mut(cols);
                let acc_bytes = rest.get_mut(..).unwrap_or_default();
                let off = acc_bytes.as_ptr().align_offset(4).min(acc_bytes.len());
                let acc: &mut [i32] = bytemuck::try_cast_slice_mut(
                    acc_bytes
                        .get_mut(off..off + m * self.cog * 4)
                        .ok_or("scratch too small")?,
                )
                .map_err(|e| e.to_string())?;
                for gi in 0..self.groups {
                    // Receptive fields of the group, as int8 rows.
                    for b in 0..n {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let row = ((b * oh + oy) * ow + ox) * k;
                                for t in 0..kh * kw {
                                    let dst = cols
                                        .get_mut(row + t * self.cig..row + (t + 1) * self.cig)
                                        .unwrap_or_default();
                                    match geo.source(oy, ox, t / kw, t % kw) {
                                        Some((iy, ix)) => {
                                            let s =
                                                ((b * h + iy) * w + ix) * self.cin + gi * self.cig;
                                            for (d, &v) in dst
                                                .iter_mut()
                                                .zip(src.get(s..s + self.cig).unwrap_or_default())
                                            {
                                                *d = to_i8(v);
                                            }
                                        }
                                        None => dst.fill(za as i8),
                                    }
                                }
                            }
                        }
                    }
                    let packed = self.packed.get(gi).ok_or("missing group weights")?;
                    qgemm(
                        pte_compute::Isa::best(),
                        cx.pool,
                        Rows {
                            data: cols,
                            m,
                            stride: k,
                        },
                        packed,
                        acc,
                    )
                    .map_err(|e| e.to_string())?;
                    let sums = packed.sums();
                    let kz = (k as i32).wrapping_mul(za).wrapping_mul(self.zw);
                    for i in 0..m {
                        let asum: i32 = if self.zw != 0 {
                            cols.get(i * k..(i + 1) * k)
                                .unwrap_or_default()
                                .iter()
                                .map(|&v| i32::from(v))
                                .sum()
                        } else {
                            0
                        };
                        for j in 0..self.cog {
                            let oc = gi * self.cog + j;
                            let v = acc
                                .get(j * m + i)
                                .copied()
                                .unwrap_or(0)
                                .wrapping_sub(za.wrapping_mul(sums.get(j).copied().unwrap_or(0)))
                                .wrapping_sub(self.zw.wrapping_mul(asum))
                                .wrapping_add(kz)
                                .wrapping_add(self.bias.get(oc).copied().unwrap_or(0));
                            if let Some(d) = out.get_mut(i * self.cout + oc) {
                                *d = T::from_i32(
                                    self.requant
                                        .apply(v, self.scales.get(oc).copied().unwrap_or(0.0)),
                                );
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn quant_conv<T: Q8>(
    cx: &NodeCx<'_>,
    g: &ConvGeometry,
    kind: Kind,
    cin: usize,
    cout: usize,
) -> PResult<Prepared> {
    let (x, w, b, y) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2)?, cx.output(0)?);
    let (min, max) = cx.bounds()?;
    let ((sa, za), (so, zo)) = x
        .per_tensor()
        .zip(y.per_tensor())
        .ok_or("8-bit activations need per-tensor parameters")?;
    let (wq, zw) = int8_values(w, "filter")?;
    let (groups, cig, cog) = (
        u(g.groups),
        u(g.group_input_channels),
        u(g.group_output_channels),
    );
    let charge = charge(cx, wq.len() + cout * 16)?;
    let (packed, dw) = match kind {
        Kind::Depthwise => (Vec::new(), wq),
        Kind::Regular => {
            let k = u(g.kernel[0]) * u(g.kernel[1]) * cig;
            let packed = wq
                .chunks_exact((cog * k).max(1))
                .map(|c| PackedI8::new(c, cog, k))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            (packed, Vec::new())
        }
    };
    let dim = if kind == Kind::Depthwise { 3 } else { 0 };
    let (lo, hi) = quant::bounds::<T>(min, max, so, zo);
    Prepared::capturing(
        QuantConv::<T> {
            g: *g,
            kind,
            groups,
            cig,
            cog,
            cin,
            cout,
            packed,
            dw,
            za,
            zw,
            bias: quant_bias(b, cout)?,
            scales: requant_scales(sa, w, dim, cout, so)?,
            requant: Requant::new(zo, lo, hi),
            geo: None,
            m: 0,
            _charge: charge,
            _t: std::marker::PhantomData,
        },
        &[1, 2],
    )
}

struct FloatDeconv {
    g: ConvGeometry,
    filter: Value,
    bias: Option<Value>,
    min: f32,
    max: f32,
    cin: usize,
    cout: usize,
    layer: Option<(DeconvNhwc, [usize; 2])>,
    _charge: Charge,
}

impl Kernel for FloatDeconv {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let [n, h, w, _] = input_nhwc(shape_of(inputs, 0)?, self.cin)?;
        if self.layer.as_ref().map(|(_, s)| *s) != Some([h, w]) {
            let g = &self.g;
            let (weights, bias) = float_filter(&self.filter, self.bias.as_ref(), 0)?;
            let layer = DeconvNhwc::new(
                Gemm::new(),
                [h, w],
                g.kernel.map(u),
                g.stride.map(u),
                g.dilation.map(u),
                g.padding.map(u),
                g.adjustment.map(u),
                u(g.groups),
                u(g.group_input_channels),
                u(g.group_output_channels),
                &weights,
                bias.as_deref(),
                self.min,
                self.max,
            )
            .map_err(|e| e.to_string())?;
            self.layer = Some((layer, [h, w]));
        }
        let (layer, _) = self.layer.as_ref().ok_or("no layer")?;
        let [oh, ow] = layer.output_size();
        set_shape(outputs, 0, &[n, oh, ow, self.cout])
    }

    fn scratch_bytes(&self, threads: usize) -> usize {
        self.layer.as_ref().map_or(0, |(l, _)| {
            l.scratch_len(threads).map_or(usize::MAX / 8, |s| s * 4)
        })
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let (layer, _) = self.layer.as_ref().ok_or("not reshaped")?;
        let n = x.dims.first().copied().unwrap_or(0);
        let out = outputs.first_mut().ok_or("no output")?;
        let yl = numel(out.dims);
        let len = layer
            .scratch_len(cx.pool.threads())
            .map_err(|e| e.to_string())?;
        let scratch = cx
            .scratch
            .slice_mut::<f32>(len)
            .map_err(|e| e.to_string())?;
        layer
            .run(
                cx.pool,
                f32s(x.bytes, numel(x.dims))?,
                n,
                f32s_mut(out.bytes, yl)?,
                scratch,
            )
            .map_err(|e| e.to_string())
    }
}

/// ConvTranspose2d (float; 8-bit through dequantized weights is not upstream's
/// arithmetic and is refused).
pub(crate) fn deconvolution(cx: &NodeCx<'_>, g: &ConvGeometry) -> PResult<Prepared> {
    let (x, w, b, y) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2)?, cx.output(0)?);
    let (min, max) = cx.bounds()?;
    if cx.node.flags != 0 {
        return Err(format!("unsupported flags {:#x}", cx.node.flags).into());
    }
    let (_, _, _, cin, cout) = channels(g, Kind::Regular, w)?;
    if w.data.is_none() || b.is_some_and(|b| b.data.is_none()) {
        return Err("convolution weights and bias must be constants".into());
    }
    if !cx.all_float(&[x, y]) {
        return Err(format!(
            "transposed convolution {} -> {} is not supported",
            describe(x),
            describe(y)
        )
        .into());
    }
    let k = (crate::graph::checked_numel(&w.dims).unwrap_or(0) / cout.max(1)).max(1);
    let charge = charge(
        cx,
        cout.saturating_add(32)
            .saturating_mul(k)
            .saturating_mul(4)
            .saturating_add(cout * 4),
    )?;
    Prepared::capturing(
        FloatDeconv {
            g: *g,
            filter: w.clone(),
            bias: b.cloned(),
            min,
            max,
            cin,
            cout,
            layer: None,
            _charge: charge,
        },
        &[1, 2],
    )
}
