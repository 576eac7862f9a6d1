//! `aten::convolution.out` on `pte_compute::Conv2d`: float32, NCHW (1-d as height 1),
//! constant weights, any groups, stride, padding and dilation; not transposed. Alone, or
//! as the fused call of a convolution with the batch normalization (folded into the
//! weights and bias at load), residual addition and activation after it. Also the
//! geometry and weights of the convolutions an NHWC region runs, transposed ones
//! included ([`deconv_spec`]).

use pte_compute::nhwc::DeconvNhwc;
use pte_compute::{Activation, Conv2d, Conv2dParams, ConvWeights, Gemm};
use pte_runtime::{Args, Charge, KernelError, KernelResult, PreparedKernel};
use smallvec::SmallVec;

use super::{at, charge, compute, constant_f32, f32_tensor, scratch, settle};

/// Where a fused call's arguments are: the convolution's nine (input, weight, bias,
/// stride, padding, dilation, transposed, output padding, groups) come first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// First of the convolution's nine arguments.
    pub conv: usize,
    /// First of the batch normalization's weight, bias, mean, variance and eps.
    pub bn: Option<usize>,
    /// A tensor added before the activation.
    pub residual: Option<usize>,
    /// The activation.
    pub act: Act,
    /// The output.
    pub out: usize,
    /// `constant_pad_nd`'s list of pads, when the convolution reads its input through
    /// zeros padded before it (a causal convolution's left padding): added to its own.
    pub pad: Option<usize>,
}

impl Layout {
    /// Gives back the file pages of the constants a layer built from these arguments
    /// holds copies of: the weight, the bias and the batch normalization's tensors
    /// (see [`Args::release_pages`]).
    pub(super) fn release_copied(&self, args: &Args<'_>) {
        let bn = self.bn.map_or(0..0, |bn| bn..bn + 4);
        for i in [self.conv + 1, self.conv + 2].into_iter().chain(bn) {
            args.release_pages(i);
        }
    }

    /// A convolution alone.
    const PLAIN: Layout = Layout {
        conv: 0,
        bn: None,
        residual: None,
        act: Act::None,
        out: 9,
        pad: None,
    };
}

/// An activation as a fused call's arguments give it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Act {
    None,
    Relu,
    /// `hardtanh` or `clamp` with both bounds: positions of the bounds.
    Clamp {
        min: usize,
        max: usize,
    },
    /// `clamp` with optional bounds (None: unbounded on that side).
    ClampOptional {
        min: usize,
        max: usize,
    },
    Sigmoid,
    Tanh,
    /// `x · sigmoid(x)`.
    Silu,
    HardSwish,
    HardSigmoid,
    /// `gelu`: position of its `approximate` string.
    Gelu {
        approximate: usize,
    },
    /// `leaky_relu`: position of its negative slope.
    LeakyRelu {
        slope: usize,
    },
}

impl Act {
    /// The activation, its scalars read now.
    pub fn resolve(self, args: &Args<'_>) -> KernelResult<Activation> {
        Ok(match self {
            Act::None => Activation::Identity,
            Act::Relu => Activation::RELU,
            Act::Clamp { min, max } => Activation::Clamp {
                min: args.double(min)? as f32,
                max: args.double(max)? as f32,
            },
            Act::ClampOptional { min, max } => {
                let bound = |i: usize, none: f64| -> KernelResult<f32> {
                    Ok(if args.is_none(i)? {
                        none as f32
                    } else {
                        args.scalar(i)?.to_f64() as f32
                    })
                };
                Activation::Clamp {
                    min: bound(min, f64::NEG_INFINITY)?,
                    max: bound(max, f64::INFINITY)?,
                }
            }
            Act::Sigmoid => Activation::Sigmoid,
            Act::Tanh => Activation::Tanh,
            Act::Silu => Activation::Silu,
            Act::HardSwish => Activation::HardSwish,
            Act::HardSigmoid => Activation::HardSigmoid,
            Act::LeakyRelu { slope } => Activation::LeakyRelu {
                slope: args.scalar(slope)?.to_f64() as f32,
            },
            Act::Gelu { approximate } => match args.string(approximate)? {
                "none" => Activation::Gelu,
                "tanh" => Activation::GeluTanh,
                other => {
                    return Err(KernelError::invalid(format!(
                        "gelu: unknown approximation {other:?}"
                    )))
                }
            },
        })
    }

    /// The scalars the activation reads (for noticing a change).
    fn key(self, args: &Args<'_>, key: &mut Key) -> KernelResult {
        match self.resolve(args)? {
            Activation::Clamp { min, max } => {
                key.push(i64::from(min.to_bits()));
                key.push(i64::from(max.to_bits()));
            }
            Activation::LeakyRelu { slope } => key.push(i64::from(slope.to_bits())),
            _ => {}
        }
        Ok(())
    }
}

/// Everything a prepared layer depends on that a call could change: the input's sizes,
/// the geometry lists, and the scalars (batch normalization's eps, activation bounds).
pub(super) type Key = SmallVec<[i64; 24]>;

pub(super) fn key(args: &Args<'_>, l: &Layout) -> KernelResult<Key> {
    let c = l.conv;
    let mut k = Key::new();
    k.extend(args.info(c)?.sizes.iter().map(|&s| s as i64));
    for list in [3, 4, 5, 7] {
        k.push(-1);
        k.extend(args.int_list(c + list)?);
    }
    k.push(args.int(c + 8)?);
    k.push(i64::from(args.bool(c + 6)?));
    if let Some(pad) = l.pad {
        k.push(-2);
        k.extend(args.int_list(pad)?);
    }
    if let Some(bn) = l.bn {
        k.push(args.double(bn + 4)?.to_bits() as i64);
    }
    l.act.key(args, &mut k)?;
    Ok(k)
}

/// A convolution prepared for one input shape.
struct Layer {
    key: Key,
    conv: Conv2d,
    /// Batch, output sizes.
    batch: usize,
    out_sizes: SmallVec<[usize; 4]>,
    _charge: Charge,
}

/// A convolution call site: alone, or fused (see [`Layout`]).
pub(super) struct FastConv {
    layout: Layout,
    layer: Layer,
}

/// Prepares a plain convolution when it qualifies.
pub(super) fn prepare(args: &Args<'_>, _: &dyn pte_runtime::Kernel) -> super::Prepared {
    Ok(build(args, &Layout::PLAIN)?.map(|layer| {
        Box::new(FastConv {
            layout: Layout::PLAIN,
            layer,
        }) as Box<dyn PreparedKernel>
    }))
}

/// Prepares a fused convolution; the fuser only proposes calls that qualify.
pub(super) fn prepare_fused(
    args: &Args<'_>,
    layout: Layout,
) -> KernelResult<Box<dyn PreparedKernel>> {
    let layer = build(args, &layout)?.ok_or_else(|| {
        KernelError::invalid(format!(
            "{}: arguments do not qualify for the fused convolution",
            args.op()
        ))
    })?;
    Ok(Box::new(FastConv { layout, layer }))
}

/// A per-axis list as (height, width), for `spatial` axes.
fn pair(list: &[i64], spatial: usize, flat: usize) -> Option<[usize; 2]> {
    let v = |i: usize| list.get(i).and_then(|&x| usize::try_from(x).ok());
    match (spatial, list.len()) {
        (1, 1) => Some([flat, v(0)?]),
        (2, 1) => Some([v(0)?, v(0)?]),
        (2, 2) => Some([v(0)?, v(1)?]),
        _ => None,
    }
}

/// `constant_pad_nd`'s pads (before and after each of the last dimensions, the last
/// first) as a convolution's `[top, left, bottom, right]` over `spatial` axes; `None`
/// when they crop or pad more than the spatial axes.
pub(super) fn extra_padding(list: &[i64], spatial: usize) -> Option<[usize; 4]> {
    if !list.len().is_multiple_of(2) || list.len() > 2 * spatial {
        return None;
    }
    let at = |i: usize| list.get(i).map_or(Some(0), |&v| usize::try_from(v).ok());
    Some([at(2)?, at(0)?, at(3)?, at(1)?])
}

/// A convolution ready to be prepared: geometry, weights and bias (batch
/// normalization folded in), activation, batch and output sizes.
pub(super) struct Spec<'a> {
    pub p: Conv2dParams,
    /// OIHW, as stored in the program.
    pub weights: &'a [f32],
    /// The batch normalization's factor per output channel, applied as the weights
    /// are arranged.
    pub scale: Option<Vec<f64>>,
    pub bias: Option<Vec<f32>>,
    pub activation: Activation,
    pub batch: usize,
    pub out_sizes: SmallVec<[usize; 4]>,
}

impl Spec<'_> {
    /// The weights with the batch normalization's factors.
    pub fn weights(&self) -> ConvWeights<'_> {
        let w = ConvWeights::oihw(self.weights);
        match &self.scale {
            Some(s) => w.scaled(s),
            None => w,
        }
    }
}

/// A convolution call's float32 operands as a 2-d convolution sees them.
struct Operands<'a> {
    /// Input and weight sizes, a 1-d convolution's with a height of 1.
    xs: SmallVec<[usize; 4]>,
    ws: SmallVec<[usize; 4]>,
    weights: &'a [f32],
    bias: Option<&'a [f32]>,
    /// Spatial axes of the call: 1 or 2.
    spatial: usize,
}

/// The operands of the convolution at `l` when it is `transposed` or not as asked,
/// float32 with constant weights and bias; `None` otherwise.
fn operands<'a>(
    args: &'a Args<'_>,
    l: &Layout,
    transposed: bool,
) -> KernelResult<Option<Operands<'a>>> {
    let c = l.conv;
    let (Some(x), Some(w)) = (f32_tensor(args, c)?, f32_tensor(args, c + 1)?) else {
        return Ok(None);
    };
    if args.bool(c + 6)? != transposed || f32_tensor(args, l.out)?.is_none() {
        return Ok(None);
    }
    let spatial = match (x.rank(), w.rank()) {
        (4, 4) => 2,
        (3, 3) => 1,
        _ => return Ok(None),
    };
    let Some(weights) = constant_f32(args, c + 1)? else {
        return Ok(None);
    };
    let bias = if args.is_none(c + 2)? {
        None
    } else {
        match (f32_tensor(args, c + 2)?, constant_f32(args, c + 2)?) {
            (Some(_), Some(b)) => Some(b),
            _ => return Ok(None),
        }
    };
    let dims = |t: &pte_runtime::TensorInfo| -> SmallVec<[usize; 4]> {
        let mut d: SmallVec<[usize; 4]> = t.sizes.iter().copied().collect();
        if spatial == 1 {
            d.insert(2, 1);
        }
        d
    };
    Ok(Some(Operands {
        xs: dims(&x),
        ws: dims(&w),
        weights,
        bias,
        spatial,
    }))
}

/// The convolution of the call's current arguments, or `None` when the call does not
/// qualify (then the generic kernel runs it).
pub(super) fn spec<'a>(args: &'a Args<'_>, l: &Layout) -> KernelResult<Option<Spec<'a>>> {
    let c = l.conv;
    let Some(o) = operands(args, l, false)? else {
        return Ok(None);
    };
    let (xs, ws, weights, bias, spatial) = (o.xs, o.ws, o.weights, o.bias, o.spatial);
    let groups = args.int(c + 8)?;
    let (&[batch, c_in, h, wd], &[c_out, _, kh, kw]) = (xs.as_slice(), ws.as_slice()) else {
        return Ok(None);
    };
    let (Some(stride), Some(pad), Some(dilation), Ok(groups)) = (
        pair(&args.int_list(c + 3)?, spatial, 1),
        pair(&args.int_list(c + 4)?, spatial, 0),
        pair(&args.int_list(c + 5)?, spatial, 1),
        usize::try_from(groups),
    ) else {
        return Ok(None);
    };
    let extra = match l.pad {
        Some(i) => extra_padding(&args.int_list(i)?, spatial),
        None => Some([0; 4]),
    };
    let padding = extra.and_then(|[top, left, bottom, right]| {
        Some([
            pad[0].checked_add(top)?,
            pad[1].checked_add(left)?,
            pad[0].checked_add(bottom)?,
            pad[1].checked_add(right)?,
        ])
    });
    let Some(padding) = padding else {
        return Ok(None);
    };
    let p = Conv2dParams {
        in_channels: c_in,
        out_channels: c_out,
        groups,
        input: [h, wd],
        kernel: [kh, kw],
        stride,
        padding,
        dilation,
    };
    // An invalid geometry, or weights that do not fit it: the generic kernel says why.
    let Ok(out) = p.output() else {
        return Ok(None);
    };
    if groups == 0
        || ws.get(1).copied().and_then(|c| c.checked_mul(groups)) != Some(c_in)
        || bias.is_some_and(|b| b.len() != c_out)
        // Empty tensors (no batch, channels, pixels or taps): the generic kernel.
        || xs.iter().chain(&ws).chain(&out).any(|&d| d == 0)
    {
        return Ok(None);
    }
    let activation = l.act.resolve(args)?;
    // Batch normalization folded into the weights and bias.
    let (scale, bias) = fold_batch_norm(args, l, c_out, bias)?;
    let mut out_sizes: SmallVec<[usize; 4]> = SmallVec::new();
    out_sizes.extend_from_slice(&[batch, c_out]);
    if spatial == 2 {
        out_sizes.push(out[0]);
    }
    out_sizes.push(out[1]);
    Ok(Some(Spec {
        p,
        weights,
        scale,
        bias,
        activation,
        batch,
        out_sizes,
    }))
}

/// The NHWC transposed convolution of the call's current arguments (weights
/// rearranged, batch normalization folded in, activation fused), or `None` when the
/// call does not qualify (the generic kernel then says why).
pub(super) fn deconv_spec(args: &Args<'_>, l: &Layout) -> KernelResult<Option<DeconvNhwc>> {
    let c = l.conv;
    let Some(o) = operands(args, l, true)? else {
        return Ok(None);
    };
    let (xs, ws, weights, bias, spatial) = (o.xs, o.ws, o.weights, o.bias, o.spatial);
    let Ok(groups) = usize::try_from(args.int(c + 8)?) else {
        return Ok(None);
    };
    if l.residual.is_some() {
        return Ok(None);
    }
    let (&[batch, c_in, h, wd], &[w_in, cog, kh, kw]) = (xs.as_slice(), ws.as_slice()) else {
        return Ok(None);
    };
    let adjustment = args.int_list(c + 7)?;
    let (Some(stride), Some(pad), Some(dilation), Some(adjustment)) = (
        pair(&args.int_list(c + 3)?, spatial, 1),
        pair(&args.int_list(c + 4)?, spatial, 0),
        pair(&args.int_list(c + 5)?, spatial, 1),
        if adjustment.is_empty() {
            Some([0, 0])
        } else {
            pair(&adjustment, spatial, 0)
        },
    ) else {
        return Ok(None);
    };
    let cig = c_in.checked_div(groups).unwrap_or(0);
    let c_out = cog.checked_mul(groups).unwrap_or(0);
    let adjustment_fits = adjustment
        .iter()
        .zip(stride.iter().zip(&dilation))
        .all(|(&a, (&s, &d))| a < s.max(d));
    if w_in != c_in
        || cig * groups != c_in
        || !adjustment_fits
        || bias.is_some_and(|b| b.len() != c_out)
        || [batch, cig, h, wd, cog, kh, kw].contains(&0)
    {
        return Ok(None);
    }
    let activation = l.act.resolve(args)?;
    let (scale, bias) = fold_batch_norm(args, l, c_out, bias)?;
    // [c_in, cog, kh, kw] (c_in = groups·cig) as [groups·cog, kh, kw, cig], each
    // output channel scaled by the batch normalization's factor.
    let taps = kh * kw;
    let mut arranged = Vec::new();
    arranged
        .try_reserve_exact(weights.len())
        .map_err(|_| KernelError::invalid("transposed convolution weights: out of memory"))?;
    for o in 0..c_out {
        let (gi, oc) = (o / cog, o % cog);
        let factor = scale.as_ref().and_then(|s| s.get(o)).copied();
        for tap in 0..taps {
            for ci in 0..cig {
                let v = weights
                    .get(((gi * cig + ci) * cog + oc) * taps + tap)
                    .copied()
                    .unwrap_or(0.0);
                arranged.push(factor.map_or(v, |f| (f64::from(v) * f) as f32));
            }
        }
    }
    let layer = DeconvNhwc::new(
        Gemm::new(),
        [h, wd],
        [kh, kw],
        stride,
        dilation,
        [pad[0], pad[1], pad[0], pad[1]],
        adjustment,
        groups,
        cig,
        cog,
        &arranged,
        bias.as_deref(),
        activation,
    );
    // A geometry with no output: the generic kernel says why.
    let Ok(layer) = layer else {
        return Ok(None);
    };
    Ok(Some(layer).filter(|l| !l.output_size().contains(&0)))
}

/// The factor per output channel (with a batch normalization at `l`) and the bias,
/// the batch normalization folded in.
#[allow(clippy::type_complexity)]
fn fold_batch_norm(
    args: &Args<'_>,
    l: &Layout,
    channels: usize,
    bias: Option<&[f32]>,
) -> KernelResult<(Option<Vec<f64>>, Option<Vec<f32>>)> {
    Ok(match l.bn {
        None => (None, bias.map(<[f32]>::to_vec)),
        Some(bn) => {
            let (scale, b) = batch_norm_coefficients(args, bn, channels, bias)?;
            (Some(scale), Some(b))
        }
    })
}

/// The per-channel factor and the shift of an inference batch normalization whose
/// weight, bias, running mean and variance are at `bn..bn + 4` and eps at `bn + 4`,
/// applied to a value that already had `bias` added: `x·s + (b - mean)·s + beta` with
/// `s = gamma / sqrt(var + eps)`, in f64, the shift rounded to f32.
pub(super) fn batch_norm_coefficients(
    args: &Args<'_>,
    bn: usize,
    channels: usize,
    bias: Option<&[f32]>,
) -> KernelResult<(Vec<f64>, Vec<f32>)> {
    let vector = |i: usize| -> KernelResult<Option<&[f32]>> {
        if args.is_none(i)? {
            return Ok(None);
        }
        match constant_f32(args, i)? {
            Some(v) if v.len() == channels => Ok(Some(v)),
            _ => Err(KernelError::invalid(format!(
                "{}: batch normalization parameter {i} must be a constant of {channels} floats",
                args.op()
            ))),
        }
    };
    let (gamma, beta) = (vector(bn)?, vector(bn + 1)?);
    let (Some(mean), Some(var)) = (vector(bn + 2)?, vector(bn + 3)?) else {
        return Err(KernelError::invalid(format!(
            "{}: batch normalization needs its running statistics",
            args.op()
        )));
    };
    let eps = args.double(bn + 4)?;
    let at = |v: Option<&[f32]>, c: usize, default: f64| {
        v.and_then(|v| v.get(c)).map_or(default, |&x| f64::from(x))
    };
    let scale: Vec<f64> = (0..channels)
        .map(|c| at(gamma, c, 1.0) / (at(Some(var), c, 1.0) + eps).sqrt())
        .collect();
    let shift = (0..channels)
        .zip(&scale)
        .map(|(c, &s)| ((at(bias, c, 0.0) - at(Some(mean), c, 0.0)) * s + at(beta, c, 0.0)) as f32)
        .collect();
    Ok((scale, shift))
}

/// The NCHW layer of the call's current arguments (see [`spec`]).
fn build(args: &Args<'_>, l: &Layout) -> KernelResult<Option<Layer>> {
    let Some(s) = spec(args, l)? else {
        return Ok(None);
    };
    // Charge what the layer will keep (packed weights round up to whole panels) before
    // building it, then settle on what it holds.
    let mut held = charge(
        args,
        (s.weights.len() + s.p.out_channels) * 4 * 2,
        "packed weights",
    )?;
    let conv = Conv2d::new(
        args.pool(),
        Gemm::new(),
        s.p,
        s.weights(),
        s.bias.as_deref(),
        s.activation,
    )
    .map_err(compute)?;
    settle(args, &mut held, conv.bytes())?;
    l.release_copied(args);
    Ok(Some(Layer {
        key: key(args, l)?,
        conv,
        batch: s.batch,
        out_sizes: s.out_sizes,
        _charge: held,
    }))
}

impl PreparedKernel for FastConv {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let l = self.layout;
        if key(args, &l)? != self.layer.key {
            self.layer = build(args, &l)?.ok_or_else(|| {
                KernelError::invalid(format!(
                    "{}: the arguments no longer qualify for the prepared convolution",
                    args.op()
                ))
            })?;
        }
        let layer = &self.layer;
        args.resize(l.out, &layer.out_sizes)?;
        if let Some(r) = l.residual {
            if args.info(r)?.sizes.as_slice() != layer.out_sizes.as_slice() {
                return Err(KernelError::invalid(format!(
                    "{}: the added tensor must have the output's shape {:?}",
                    args.op(),
                    layer.out_sizes.as_slice()
                )));
            }
        }
        let pool = args.pool();
        let reads = [at(l.conv), at(l.residual.unwrap_or(l.conv))];
        let mut io = args.io(
            reads
                .get(..1 + usize::from(l.residual.is_some()))
                .unwrap_or_default(),
            &[at(l.out)],
        )?;
        let missing = || KernelError::Failed("missing tensor view".into());
        let x = io.inputs.first().ok_or_else(missing)?.as_slice::<f32>()?;
        let residual = match io.inputs.get(1) {
            Some(r) => Some(r.as_slice::<f32>()?),
            None => None,
        };
        let y = io
            .outputs
            .first_mut()
            .ok_or_else(missing)?
            .as_mut_slice::<f32>()?;
        let len = layer.conv.scratch_len(pool.threads()).map_err(compute)?;
        let s = scratch(io.scratch, len)?;
        match residual {
            None => layer.conv.run(pool, x, layer.batch, y, s),
            Some(r) => layer.conv.run_add(pool, x, layer.batch, r, y, s),
        }
        .map_err(compute)
    }
}
