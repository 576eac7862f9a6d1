//! Convolution nodes (regular, depthwise, transposed) over NHWC images.
//!
//! Float convolutions run pte-compute's prepared NHWC layers (weights packed once);
//! 8-bit ones its 8-bit layers ([`QConvNhwc`]: 32-bit sums, requantized per output
//! channel the way XNNPACK's fp32 kernels do).

use std::borrow::Cow;
use std::sync::Arc;

use pte_compute::nhwc::{ConvNhwc, ConvWeights, DeconvNhwc, DepthwiseChain, Geometry};
use pte_compute::qconv::{QConvNhwc, QuantParams};
use pte_compute::{Activation, Gemm, Staging, ThreadPool};
use pte_runtime::Charge;

use super::linear::{charge, quant_bias, requant_scales};
use super::quant::{self, Q8};
use super::weights::{float_values, int8_values};
use super::{
    arg, bytes, bytes_mut, describe, f32s, f32s_mut, family, numel, set_shape, shape_of, Family,
    KResult, Kernel, NodeCx, PResult, PrepareError, Prepared,
};
use crate::exec::{Cx, In, Out};
use crate::graph::{Chain, ConvGeometry, Dims, Node, Op, Value};

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
    fused: Option<Activation>,
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
        // OHWI weights are packed as they are stored, with no temporary to lend.
        ConvNhwc::new(
            &self.pool,
            &Staging::passing(),
            Gemm::new(),
            geo.conv2d(groups * cig, groups * cog, groups),
            weights,
            bias.as_deref(),
            activation(self.min, self.max, self.fused),
            &mut |part| {
                if let Some(data) = &self.filter.data {
                    data.release_part(bytemuck::cast_slice(part));
                }
            },
        )
        .map_err(|e| e.to_string())
    }
}

/// The activation of a float layer: its output bounds, or a fused activation.
pub(crate) fn activation(min: f32, max: f32, fused: Option<Activation>) -> Activation {
    if let Some(a) = fused {
        a
    } else if min == f32::NEG_INFINITY && max == f32::INFINITY {
        Activation::Identity
    } else {
        Activation::Clamp { min, max }
    }
}

impl Kernel for FloatConv {
    fn variant(&self) -> Option<&'static str> {
        self.layer.as_ref().map(|(layer, _)| layer.algorithm())
    }

    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let [n, h, w, _] = input_nhwc(shape_of(inputs, 0)?, self.cin)?;
        if self.layer.as_ref().map(|(_, s)| *s) != Some([h, w]) {
            let layer = self.build(h, w)?;
            self.layer = Some((layer, [h, w]));
            // Packed: the file's copy leaves the resident set now, layer by layer.
            for v in std::iter::once(&self.filter).chain(&self.bias) {
                if let Some(data) = &v.data {
                    data.release_pages();
                }
            }
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
    if let Some(chain) = &cx.node.chain {
        return depthwise_chain(cx, chain);
    }
    let (x, w, y) = (cx.input(0)?, cx.input(1)?, cx.output(0)?);
    let (_, _, _, cin, cout) = channels(g, kind, w)?;
    match (family(x), family(y)) {
        (Family::Float, Family::Float) => {
            let bounds = cx.bounds()?;
            let conv = float_conv(cx, g, kind, bounds, cx.node.fused)?;
            Prepared::capturing(conv, &[1, 2])
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

/// Charges the packed f32 weights of a filter `w` with `cout` output channels (panels
/// padded to whole tiles) and the bias.
fn float_weights_charge(cx: &NodeCx<'_>, w: &Value, cout: usize) -> PResult<Charge> {
    let k = (crate::graph::checked_numel(&w.dims).unwrap_or(0) / cout.max(1)).max(1);
    charge(
        cx,
        cout.saturating_add(32)
            .saturating_mul(k)
            .saturating_mul(4)
            .saturating_add(cout * 4),
    )
}

/// The float convolution of node `cx` (its flags, constants and bias checked) with
/// output `bounds` and a fused SiLU.
fn float_conv(
    cx: &NodeCx<'_>,
    g: &ConvGeometry,
    kind: Kind,
    (min, max): (f32, f32),
    fused: Option<Activation>,
) -> PResult<FloatConv> {
    let (w, b) = (cx.input(1)?, cx.opt_input(2)?);
    if cx.node.flags != 0 {
        return Err(format!("unsupported flags {:#x}", cx.node.flags).into());
    }
    if min.is_nan() || max.is_nan() || min > max {
        return Err(format!("output bounds [{min}, {max}] are invalid").into());
    }
    let (_, _, _, cin, cout) = channels(g, kind, w)?;
    if w.data.is_none() || b.is_some_and(|b| b.data.is_none()) {
        return Err("convolution weights and bias must be constants".into());
    }
    if b.is_some_and(|b| b.dims.as_slice() != [cout]) {
        return Err(format!(
            "bias dims {:?} for {cout} channels",
            b.map(|b| b.dims.clone())
        )
        .into());
    }
    let charge = float_weights_charge(cx, w, cout)?;
    Ok(FloatConv {
        g: *g,
        kind,
        filter: w.clone(),
        bias: b.cloned(),
        min,
        max,
        cin,
        cout,
        layer: None,
        fused,
        pool: cx.pool.clone(),
        _charge: charge,
    })
}

/// A depthwise convolution with the pointwise ones fused around it
/// ([`crate::graph::Chain`]): band by band on pte-compute's [`DepthwiseChain`] when
/// it takes the layers and the image splits into bands for the pool's threads, else
/// layer by layer through scratch.
struct ChainConv {
    expand: Option<FloatConv>,
    depthwise: FloatConv,
    project: Option<FloatConv>,
    residual: bool,
    /// Images of the current input shape.
    batch: usize,
}

/// Prepares a fused chain (see `fuse.rs`): each layer from its own node.
fn depthwise_chain(cx: &NodeCx<'_>, chain: &Chain) -> PResult<Prepared> {
    let layer = |node: &Node, kind: Kind, bounds: (f32, f32), fused: Option<Activation>| {
        let (Op::Conv2d(g) | Op::DepthwiseConv2d(g)) = &node.op else {
            return Err(PrepareError::from("a fused layer is not a convolution"));
        };
        let sub = NodeCx { node, ..*cx };
        float_conv(&sub, g, kind, bounds, fused)
    };
    let node = cx.node;
    let own = (node.min, node.max);
    let expand = chain
        .expand
        .as_ref()
        .map(|e| layer(e, Kind::Regular, (e.min, e.max), e.fused))
        .transpose()?;
    let depthwise = layer(node, Kind::Depthwise, own, node.fused)?;
    // A residual addition's bounds apply after it, the projection's own being none.
    let project = chain
        .project
        .as_ref()
        .map(|p| match chain.residual {
            Some(bounds) => layer(p, Kind::Regular, bounds, None),
            None => layer(p, Kind::Regular, (p.min, p.max), p.fused),
        })
        .transpose()?;
    let all_float = [cx.input(0)?, cx.output(0)?]
        .iter()
        .all(|v| family(v) == Family::Float);
    if !all_float || (chain.residual.is_some() && project.is_none()) {
        return Err(
            "a fused depthwise chain must be float, its residual after a projection".into(),
        );
    }
    if chain.residual.is_some() {
        cx.input(3)?;
    }
    Prepared::capturing(
        ChainConv {
            expand,
            depthwise,
            project,
            residual: chain.residual.is_some(),
            batch: 0,
        },
        &[1, 2],
    )
}

impl ChainConv {
    /// The built layers (after `reshape`).
    fn layers(&self) -> KResult<(Option<&ConvNhwc>, &ConvNhwc, Option<&ConvNhwc>)> {
        fn built(c: &FloatConv) -> KResult<&ConvNhwc> {
            c.layer
                .as_ref()
                .map(|(l, _)| l)
                .ok_or_else(|| "not reshaped".into())
        }
        Ok((
            self.expand.as_ref().map(built).transpose()?,
            built(&self.depthwise)?,
            self.project.as_ref().map(built).transpose()?,
        ))
    }

    /// Scratch (f32 elements) of the layer-by-layer run: the intermediate outputs,
    /// then the largest layer's own.
    fn layered_scratch(&self, threads: usize) -> KResult<(usize, usize, usize)> {
        let (e, d, p) = self.layers()?;
        let out_len = |l: &ConvNhwc| l.io_len(self.batch).map(|(_, y)| y);
        let expanded = e.map(out_len).transpose().map_err(|e| e.to_string())?;
        let filtered = p
            .map(|_| out_len(d))
            .transpose()
            .map_err(|e| e.to_string())?;
        let mut own = 0;
        for l in [e, Some(d), p].into_iter().flatten() {
            own = own.max(l.scratch_len(threads).map_err(|e| e.to_string())?);
        }
        Ok((expanded.unwrap_or(0), filtered.unwrap_or(0), own))
    }
}

impl Kernel for ChainConv {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let mut dims: Dims = shape_of(inputs, 0)?.iter().copied().collect();
        let layers = [
            self.expand.as_mut(),
            Some(&mut self.depthwise),
            self.project.as_mut(),
        ];
        for layer in layers.into_iter().flatten() {
            let mut out = [Dims::new()];
            layer.reshape(&[Some(&dims)], &mut out)?;
            let [next] = out;
            dims = next;
        }
        if self.residual && shape_of(inputs, 3)? != dims.as_slice() {
            return Err(format!(
                "residual {:?} is not shaped as the output {dims:?}",
                shape_of(inputs, 3)?
            ));
        }
        self.batch = dims.first().copied().unwrap_or(0);
        set_shape(outputs, 0, &dims)
    }

    fn scratch_bytes(&self, threads: usize) -> usize {
        let Ok((e, d, p)) = self.layers() else {
            return 0;
        };
        // A chain the compute crate does not take runs layer by layer.
        let chained = DepthwiseChain::new(e, d, p).map_or(Ok(0), |c| c.scratch_len(threads));
        let layered = self.layered_scratch(threads);
        match (chained, layered) {
            (Ok(c), Ok((a, b, own))) => c
                .max(a.saturating_add(b).saturating_add(own))
                .saturating_mul(4),
            _ => usize::MAX / 8,
        }
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let err = |e: pte_compute::Error| e.to_string();
        let (e, d, p) = self.layers()?;
        let n = self.batch;
        let xl = e.unwrap_or(d).io_len(n).map_err(err)?.0;
        let yl = p.unwrap_or(d).io_len(n).map_err(err)?.1;
        let x = f32s(arg(inputs, 0)?.bytes, xl)?;
        let residual = match self.residual {
            true => Some(f32s(arg(inputs, 3)?.bytes, yl)?),
            false => None,
        };
        let y = f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, yl)?;
        let threads = cx.pool.threads();
        let chain = DepthwiseChain::new(e, d, p);
        if let Some(chain) = chain.filter(|c| c.splits_well(n, threads)) {
            let len = chain.scratch_len(threads).map_err(err)?;
            let scratch = cx
                .scratch
                .slice_mut::<f32>(len)
                .map_err(|e| e.to_string())?;
            return chain.run(cx.pool, x, n, residual, y, scratch).map_err(err);
        }
        let (a_len, b_len, own) = self.layered_scratch(threads)?;
        let len = a_len.saturating_add(b_len).saturating_add(own);
        let scratch = cx
            .scratch
            .slice_mut::<f32>(len)
            .map_err(|e| e.to_string())?;
        let (expanded, rest) = scratch.split_at_mut(a_len.min(len));
        let (filtered, own) = rest.split_at_mut(b_len.min(rest.len()));
        let pool = cx.pool;
        let dw_input: &[f32] = match e {
            Some(e) => {
                e.run(pool, x, n, None, expanded, own).map_err(err)?;
                expanded
            }
            None => x,
        };
        match p {
            Some(p) => {
                d.run(pool, dw_input, n, None, filtered, own).map_err(err)?;
                p.run(pool, filtered, n, residual, y, own).map_err(err)
            }
            None => d.run(pool, dw_input, n, None, y, own).map_err(err),
        }
    }
}

/// 8-bit convolution (regular or depthwise).
/// An 8-bit convolution: pte-compute's [`QConvNhwc`], built (weights packed) for each
/// input size.
struct QuantConv<T> {
    g: ConvGeometry,
    kind: Kind,
    cin: usize,
    cout: usize,
    /// The weights, read (in place when int8) as the layer is built.
    filter: Value,
    zw: i32,
    za: i32,
    bias: Vec<i32>,
    scales: Vec<f32>,
    /// Output zero point and quantized bounds.
    out: (i32, i32, i32),
    layer: Option<(QConvNhwc, [usize; 2])>,
    _charge: Charge,
    _t: std::marker::PhantomData<T>,
}

impl<T: Q8> QuantConv<T> {
    fn build(&self, h: usize, w: usize) -> KResult<QConvNhwc> {
        let (groups, cig, cog) = match self.kind {
            Kind::Depthwise => (self.cin, 1, self.cout / self.cin.max(1)),
            Kind::Regular => (
                u(self.g.groups),
                u(self.g.group_input_channels),
                u(self.g.group_output_channels),
            ),
        };
        let p = geometry(&self.g, [h, w]).conv2d(groups * cig, groups * cog, groups);
        let (zero, min, max) = self.out;
        let q = QuantParams {
            signed: T::MIN < 0,
            input_zero: self.za,
            weight_zero: self.zw,
            bias: &self.bias,
            scale: &self.scales,
            output_zero: zero,
            output_min: min,
            output_max: max,
        };
        let (weights, _) = int8_values(&self.filter, "filter").map_err(|e| format!("{e:?}"))?;
        QConvNhwc::new(p, self.kind == Kind::Depthwise, &weights, &q).map_err(|e| e.to_string())
    }
}

impl<T: Q8> Kernel for QuantConv<T> {
    fn variant(&self) -> Option<&'static str> {
        self.layer.as_ref().map(|(layer, _)| layer.algorithm())
    }

    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let [n, h, w, _] = input_nhwc(shape_of(inputs, 0)?, self.cin)?;
        if self.layer.as_ref().map(|(_, s)| *s) != Some([h, w]) {
            let layer = self.build(h, w)?;
            self.layer = Some((layer, [h, w]));
            // Packed: as for float layers, the filter's pages go layer by layer.
            if let Some(data) = &self.filter.data {
                data.release_pages();
            }
        }
        let (layer, _) = self.layer.as_ref().ok_or("no layer")?;
        let [oh, ow] = layer.output_size();
        set_shape(outputs, 0, &[n, oh, ow, self.cout])
    }

    fn scratch_bytes(&self, _threads: usize) -> usize {
        // One image at a time would do, but the batch is not known here: the
        // largest input the layer was built for is one image of the planned size.
        self.layer
            .as_ref()
            .map_or(0, |(l, _)| l.scratch_len(1).unwrap_or(usize::MAX / 8))
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let (layer, _) = self.layer.as_ref().ok_or("not reshaped")?;
        let n = x.dims.first().copied().unwrap_or(0);
        let (xl, yl) = layer.io_len(n).map_err(|e| e.to_string())?;
        let out = bytes_mut(outputs.first_mut().ok_or("no output")?.bytes, yl)?;
        let scratch = cx.scratch.as_mut_bytes();
        let image = layer.scratch_len(1).map_err(|e| e.to_string())?;
        let (xi, yi) = layer.io_len(1).map_err(|e| e.to_string())?;
        // Image by image, so that the scratch planned for one serves any batch.
        for b in 0..n {
            let x = bytes(x.bytes, xl)?
                .get(b * xi..(b + 1) * xi)
                .unwrap_or_default();
            let y = out.get_mut(b * yi..(b + 1) * yi).unwrap_or_default();
            let s = scratch.get_mut(..image).ok_or("scratch too small")?;
            layer.run(cx.pool, x, 1, y, s).map_err(|e| e.to_string())?;
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
    let (weights, zw) = int8_values(w, "filter")?;
    // The weights (a copy unless int8) and their prepared copy (depthwise: widened to
    // 32 bits; else panels of 32 channels, each tap's depth padded to four after up to
    // three copies of each channel for a weight zero point), the bias and scales.
    let taps = u(g.kernel[0]).saturating_mul(u(g.kernel[1]));
    let prepared = match kind {
        Kind::Depthwise => weights.len().saturating_mul(4),
        Kind::Regular => {
            let copies = if zw != 0 { 3 } else { 1 };
            let depth = u(g.group_input_channels)
                .saturating_mul(copies)
                .saturating_add(3);
            u(g.groups)
                .saturating_mul(u(g.group_output_channels).saturating_add(31))
                .saturating_mul(taps)
                .saturating_mul(depth)
        }
    };
    let charge = charge(
        cx,
        weights
            .len()
            .saturating_add(prepared)
            .saturating_add(cout * 16),
    )?;
    let dim = if kind == Kind::Depthwise { 3 } else { 0 };
    let (lo, hi) = quant::bounds::<T>(min, max, so, zo);
    Prepared::capturing(
        QuantConv::<T> {
            g: *g,
            kind,
            cin,
            cout,
            filter: w.clone(),
            zw,
            za,
            bias: quant_bias(b, cout)?,
            scales: requant_scales(sa, w, dim, cout, so)?,
            out: (zo, lo, hi),
            layer: None,
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
                activation(self.min, self.max, None),
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
    let charge = float_weights_charge(cx, w, cout)?;
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
