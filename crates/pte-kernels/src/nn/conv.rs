//! `aten::convolution.out`: 1-d and 2-d (a 1-d convolution is a 2-d one of height 1),
//! batched or not, grouped, depthwise and transposed, inputs and weights of any dim order
//! (gathered in row-major order first).
//!
//! float32 runs on `pte-compute` ([`Conv2d`]: pointwise products, implicit im2col
//! products, direct depthwise loops; [`ConvTranspose2d`]: a product then col2im), the
//! layer prepared at a call site's first call and kept (with the memory of its
//! arranged weights charged to the method's budget). Every other float
//! type runs one direct loop per output element, accumulating in float32 for float16 and
//! bfloat16 (PyTorch's opmath type).

use pte_compute::{
    Activation, Conv2d, Conv2dParams, ConvTranspose2d, ConvTranspose2dParams, ConvWeights, Gemm,
};
use pte_runtime::{Arg, Args, Charge, DType, Dims, KernelError, KernelRegistry, KernelResult};
use smallvec::SmallVec;

use super::spatial_pair;
use crate::layout::{read_dense, Dense};
use crate::num::{Elem, Float, Ring};
use crate::util::{compute_error, oob, to_size, Scratch, Stateful};

/// Sizes of one convolution; index 0 of each pair is the height, 1 the width.
#[derive(Clone, Copy, PartialEq)]
struct Geom {
    batch: usize,
    c_in: usize,
    c_out: usize,
    groups: usize,
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dilation: [usize; 2],
    out_pad: [usize; 2],
    output: [usize; 2],
    transposed: bool,
}

fn invalid(msg: String) -> KernelError {
    KernelError::invalid(msg)
}

/// Output length of one axis.
fn output_len(g: &Geom, axis: usize) -> KernelResult<usize> {
    let at = |v: [usize; 2]| v.get(axis).copied().ok_or_else(oob);
    let (i, k, s, p, d) = (
        at(g.input)?,
        at(g.kernel)?,
        at(g.stride)?,
        at(g.pad)?,
        at(g.dilation)?,
    );
    let overflow = || invalid("convolution sizes overflow".into());
    // Extent of the dilated kernel, d·(k - 1) + 1.
    let extent = k
        .checked_sub(1)
        .and_then(|k1| d.checked_mul(k1))
        .and_then(|v| v.checked_add(1))
        .ok_or_else(overflow)?;
    let pads = p.checked_mul(2).ok_or_else(overflow)?;
    if g.transposed {
        // (i - 1)·s - 2p + d·(k - 1) + output_padding + 1
        let full = i
            .checked_sub(1)
            .and_then(|i1| i1.checked_mul(s))
            .and_then(|v| v.checked_add(extent))
            .and_then(|v| v.checked_add(at(g.out_pad).ok()?))
            .ok_or_else(overflow)?;
        full.checked_sub(pads).filter(|&o| o > 0).ok_or_else(|| {
            invalid(format!(
                "transposed convolution: padding {p} leaves no output of an input of {i}"
            ))
        })
    } else {
        let padded = i.checked_add(pads).ok_or_else(overflow)?;
        padded
            .checked_sub(extent)
            .map(|v| v / s + 1)
            .ok_or_else(|| {
                invalid(format!(
                    "kernel of {k} (dilation {d}) is larger than the padded input of {padded}"
                ))
            })
    }
}

/// The last `n` (1 or 2) sizes as (height, width), height 1 for one.
fn spatial_sizes(sizes: &[usize], n: usize) -> KernelResult<[usize; 2]> {
    match (n, sizes) {
        (1, [.., w]) => Ok([1, *w]),
        (2, [.., h, w]) => Ok([*h, *w]),
        _ => Err(oob()),
    }
}

/// Where a call's convolution arguments are: the input, the weight, and the first of
/// stride, padding, dilation, transposed, output_padding and groups.
#[derive(Clone, Copy)]
struct Positions {
    input: usize,
    weight: usize,
    params: usize,
}

/// `convolution.out(input, weight, bias?, stride, padding, dilation, transposed,
/// output_padding, groups, out)`.
const FORWARD: Positions = Positions {
    input: 0,
    weight: 1,
    params: 3,
};

/// `convolution_backward.out(grad_output, input, weight, bias_sizes?, stride, padding,
/// dilation, transposed, output_padding, groups, output_mask, out0, out1, out2)`.
const BACKWARD: Positions = Positions {
    input: 1,
    weight: 2,
    params: 4,
};

/// Reads and checks the arguments; returns the geometry and the output sizes.
fn geometry(args: &Args<'_>, at: Positions) -> KernelResult<(Geom, Dims)> {
    let (x, w) = (args.info(at.input)?, args.info(at.weight)?);
    let spatial = match w.rank() {
        3 => 1,
        4 => 2,
        r => {
            return Err(invalid(format!(
                "convolution supports 1-d and 2-d kernels (weight of rank 3 or 4), got rank {r}"
            )))
        }
    };
    let batched = match x.rank() {
        r if r == spatial + 2 => true,
        r if r == spatial + 1 => false,
        r => {
            return Err(invalid(format!(
                "a {spatial}-d convolution cannot take an input of rank {r}"
            )))
        }
    };
    let input = spatial_sizes(&x.sizes, spatial)?;
    let kernel = spatial_sizes(&w.sizes, spatial)?;
    let p = at.params;
    let stride = spatial_pair(&args.int_list(p)?, spatial, "stride", 1)?;
    let pad = spatial_pair(&args.int_list(p + 1)?, spatial, "padding", 0)?;
    let dilation = spatial_pair(&args.int_list(p + 2)?, spatial, "dilation", 1)?;
    let transposed = args.bool(p + 3)?;
    let out_pad_list = args.int_list(p + 4)?;
    let out_pad = if out_pad_list.is_empty() {
        [0, 0]
    } else {
        spatial_pair(&out_pad_list, spatial, "output_padding", 0)?
    };
    let groups = to_size(args.int(p + 5)?, "groups")?;
    if groups == 0 || stride.contains(&0) || dilation.contains(&0) || kernel.contains(&0) {
        return Err(invalid(format!(
            "groups ({groups}), stride {stride:?}, dilation {dilation:?} and kernel {kernel:?} must be positive"
        )));
    }
    let c_in = *x.sizes.get(usize::from(batched)).ok_or_else(oob)?;
    let (w0, w1) = (
        *w.sizes.first().ok_or_else(oob)?,
        *w.sizes.get(1).ok_or_else(oob)?,
    );
    let c_out = if transposed {
        if w0 != c_in || c_in % groups != 0 {
            return Err(invalid(format!(
                "transposed weight {:?} does not fit {c_in} input channels in {groups} groups",
                w.sizes.as_slice()
            )));
        }
        if out_pad
            .iter()
            .zip(stride.iter().zip(&dilation))
            .any(|(&o, (&s, &d))| o >= s.max(d))
            || input.contains(&0)
        {
            return Err(invalid(format!(
                "output_padding {out_pad:?} must be smaller than stride or dilation, input {input:?} non-empty"
            )));
        }
        w1.checked_mul(groups)
            .ok_or_else(|| invalid("too many channels".into()))?
    } else {
        if w1.checked_mul(groups) != Some(c_in) || w0 % groups != 0 {
            return Err(invalid(format!(
                "weight {:?} does not fit {c_in} input channels in {groups} groups",
                w.sizes.as_slice()
            )));
        }
        w0
    };
    let mut g = Geom {
        batch: if batched {
            *x.sizes.first().ok_or_else(oob)?
        } else {
            1
        },
        c_in,
        c_out,
        groups,
        input,
        kernel,
        stride,
        pad,
        dilation,
        out_pad,
        output: [0, 0],
        transposed,
    };
    g.output = [output_len(&g, 0)?, output_len(&g, 1)?];
    if !transposed {
        // A stride past the padded input has the effect of one that equals it (one
        // output); clamped, so that no working memory is sized by the argument.
        for ((s, &i), &p) in g.stride.iter_mut().zip(&g.input).zip(&g.pad) {
            *s = (*s).min(i.saturating_add(p.saturating_mul(2)).max(1));
        }
    }
    let mut sizes = Dims::new();
    if batched {
        sizes.push(g.batch);
    }
    sizes.push(c_out);
    sizes.extend_from_slice(g.output.get(2 - spatial..).ok_or_else(oob)?);
    Ok((g, sizes))
}

fn convolution(args: &mut Args<'_>, cache: &mut Option<Prepared>) -> KernelResult {
    let (g, out_sizes) = geometry(args, FORWARD)?;
    let bias = args.opt_tensor(2)?;
    let dtype = args.info(0)?.dtype;
    let dtypes = [
        Some(dtype),
        Some(args.info(1)?.dtype),
        Some(args.info(9)?.dtype),
        bias.as_ref().map(|b| b.dtype),
    ];
    if dtypes.iter().flatten().any(|&d| d != dtype) {
        return Err(KernelError::dtypes(
            &dtypes.iter().flatten().copied().collect::<Vec<DType>>(),
        ));
    }
    if let Some(b) = &bias {
        if b.numel() != g.c_out {
            return Err(invalid(format!(
                "bias of shape {:?} does not match {} output channels",
                b.sizes.as_slice(),
                g.c_out
            )));
        }
    }
    args.resize(9, &out_sizes)?;
    if out_sizes.contains(&0) {
        return Ok(());
    }
    // A product of depth zero (no input channels or no taps) is the bias alone, which the
    // direct loop gives; `pte-compute` prepares only real products.
    let empty_product = g.c_in / g.groups == 0 || g.kernel.contains(&0);
    if dtype == DType::F32 && !empty_product {
        return convolution_f32(args, &g, bias.is_some(), cache);
    }
    let reads: &[Arg] = if bias.is_some() {
        &[Arg::At(0), Arg::At(1), Arg::At(2)]
    } else {
        &[Arg::At(0), Arg::At(1)]
    };
    crate::dispatch_float!(dtype, T => {
        let mut io = Dense::io(args, reads, &[Arg::At(9)], &[])?;
        let (x, w) = (io.input::<T>(0)?, io.input::<T>(1)?);
        let b = if bias.is_some() { Some(io.input::<T>(2)?) } else { None };
        direct(&g, x, w, b, io.output::<T>(0)?)?;
        io.finish()
    }, Err(KernelError::dtypes(&[dtype])))
}

/// An upper bound of the bytes `pte-compute` keeps for prepared weights: packed panels
/// padded to a micro-kernel's rows (at most 16) plus alignment, per group, and the bias.
fn prepared_bytes(groups: usize, rows: usize, depth: usize, bias: usize) -> KernelResult<u64> {
    let per_group = rows
        .checked_add(16)
        .and_then(|r| r.checked_mul(depth))
        .and_then(|v| v.checked_add(32));
    per_group
        .and_then(|p| p.checked_mul(groups))
        .and_then(|v| v.checked_add(bias))
        .and_then(|v| v.checked_mul(4))
        .map(|v| v as u64)
        .ok_or_else(|| invalid("convolution weights are too large".into()))
}

/// A float32 layer prepared by `pte-compute` for one geometry, and the memory it holds.
pub struct Prepared {
    geom: Geom,
    layer: Layer,
    _charge: Charge,
}

enum Layer {
    Direct(Conv2d),
    Transposed(ConvTranspose2d),
}

/// Prepares the float32 layer of geometry `g`: weights (and bias) read in row-major
/// order, arranged by `pte-compute`, the memory it keeps charged to the budget.
fn prepare_f32(args: &Args<'_>, g: &Geom, has_bias: bool) -> KernelResult<Prepared> {
    let budget = args.budget().clone();
    let (w, _w_charge) = read_dense::<f32>(args, Arg::At(1))?;
    let bias = if has_bias {
        Some(read_dense::<f32>(args, Arg::At(2))?)
    } else {
        None
    };
    let b = bias.as_ref().map(|(b, _)| &b[..]);
    let (cig, cog) = (g.c_in / g.groups, g.c_out / g.groups);
    let taps = g.kernel[0] * g.kernel[1];
    let gemm = Gemm::new();
    let err = compute_error;
    let (layer, charge) = if g.transposed {
        let charge = prepared_bytes(g.groups, cog * taps, cig, g.c_out)?;
        let charge = budget.charge(charge).map_err(memory)?;
        let p = ConvTranspose2dParams {
            in_channels: g.c_in,
            out_channels: g.c_out,
            groups: g.groups,
            input: g.input,
            kernel: g.kernel,
            stride: g.stride,
            padding: g.pad,
            output_padding: g.out_pad,
            dilation: g.dilation,
        };
        let layer = ConvTranspose2d::new(gemm, p, &w, b, Activation::default()).map_err(err)?;
        (Layer::Transposed(layer), charge)
    } else {
        let charge = prepared_bytes(g.groups, cog, cig * taps, g.c_out)?;
        let charge = budget.charge(charge).map_err(memory)?;
        let [ph, pw] = g.pad;
        let p = Conv2dParams {
            in_channels: g.c_in,
            out_channels: g.c_out,
            groups: g.groups,
            input: g.input,
            kernel: g.kernel,
            stride: g.stride,
            padding: [ph, pw, ph, pw],
            dilation: g.dilation,
        };
        let layer = Conv2d::new(
            args.pool(),
            gemm,
            p,
            ConvWeights::oihw(&w),
            b,
            Activation::default(),
        )
        .map_err(err)?;
        (Layer::Direct(layer), charge)
    };
    Ok(Prepared {
        geom: *g,
        layer,
        _charge: charge,
    })
}

/// float32 convolution on `pte-compute`. The layer prepared at the first call is kept
/// while the geometry stays the same and the weights are constants (as they are in
/// exported models), so later calls allocate nothing.
fn convolution_f32(
    args: &mut Args<'_>,
    g: &Geom,
    has_bias: bool,
    cache: &mut Option<Prepared>,
) -> KernelResult {
    let constant = args.constant(1)?.is_some() && (!has_bias || args.constant(2)?.is_some());
    let reusable = constant && cache.as_ref().is_some_and(|p| p.geom == *g);
    if !reusable {
        *cache = None;
        *cache = Some(prepare_f32(args, g, has_bias)?);
    }
    let prepared = cache.as_ref().ok_or_else(oob)?;
    let pool = args.pool();
    let len = match &prepared.layer {
        Layer::Direct(c) => c.scratch_len(pool.threads()),
        Layer::Transposed(c) => c.scratch_len(pool.threads()),
    }
    .map_err(compute_error)?;
    let mut io = Dense::io(
        args,
        &[Arg::At(0)],
        &[Arg::At(9)],
        &[Scratch::piece::<f32>(len)],
    )?;
    let scratch = io.scratch.take::<f32>(len)?;
    let x = io.input::<f32>(0)?;
    let out = io.output::<f32>(0)?;
    match &prepared.layer {
        Layer::Direct(c) => c.run(pool, x, g.batch, out, scratch),
        Layer::Transposed(c) => c.run(pool, x, g.batch, out, scratch),
    }
    .map_err(compute_error)?;
    io.finish()
}

fn memory(source: pte_runtime::MemoryError) -> KernelError {
    KernelError::Memory {
        what: "convolution weights".into(),
        source,
    }
}

/// The input position a kernel tap reads for output `o`: `o·stride + k·dilation - pad`
/// (None in the padding).
fn tap(
    o: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    len: usize,
) -> Option<usize> {
    (o * stride + k * dilation)
        .checked_sub(pad)
        .filter(|&i| i < len)
}

/// The input position whose tap `k` lands on output `o` of a transposed convolution:
/// `(o + pad - k·dilation) / stride` when that divides exactly.
fn source(
    o: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    len: usize,
) -> Option<usize> {
    let at = (o + pad).checked_sub(k * dilation)?;
    (at % stride == 0)
        .then_some(at / stride)
        .filter(|&i| i < len)
}

/// Calls `f(x, y, w)` for every product a convolution sums: `x` an element of the input
/// (the smaller side of a transposed convolution), `y` of the output, `w` of the weight,
/// as offsets in row-major order; outputs in order, each output's terms in order.
fn connections(g: &Geom, mut f: impl FnMut(usize, usize, usize)) {
    let ([h, wd], [kh, kw], [oh, ow]) = (g.input, g.kernel, g.output);
    let ([sh, sw], [ph, pw], [dh, dw]) = (g.stride, g.pad, g.dilation);
    let (cig, cog) = (g.c_in / g.groups, g.c_out / g.groups);
    let (hw, ohw, taps) = (h * wd, oh * ow, kh * kw);
    for b in 0..g.batch {
        for oc in 0..g.c_out {
            let gi = oc / cog.max(1);
            for o in 0..ohw {
                let (oy, ox) = (o / ow, o % ow);
                let y = (b * g.c_out + oc) * ohw + o;
                for c in 0..cig {
                    let ic = gi * cig + c;
                    // Weights: [c_out, c_in/groups, kh, kw], transposed [c_in, c_out/groups, kh, kw].
                    let w0 = if g.transposed {
                        (ic * cog + oc % cog.max(1)) * taps
                    } else {
                        (oc * cig + c) * taps
                    };
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let (iy, ix) = if g.transposed {
                                (
                                    source(oy, ky, sh, dh, ph, h),
                                    source(ox, kx, sw, dw, pw, wd),
                                )
                            } else {
                                (tap(oy, ky, sh, dh, ph, h), tap(ox, kx, sw, dw, pw, wd))
                            };
                            if let (Some(iy), Some(ix)) = (iy, ix) {
                                let x = (b * g.c_in + ic) * hw + iy * wd + ix;
                                f(x, y, w0 + ky * kw + kx);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The direct convolution: each output the sum of its terms, accumulated in `T::Acc`.
fn direct<T: Float>(g: &Geom, x: &[T], w: &[T], bias: Option<&[T]>, out: &mut [T]) -> KernelResult {
    let ohw = g.output[0] * g.output[1];
    let mut ok = true;
    let mut current: Option<(usize, T::Acc)> = None;
    let bias_of = |y: usize| {
        let oc = y / ohw.max(1) % g.c_out.max(1);
        bias.and_then(|b| b.get(oc))
            .map_or(<T::Acc as Ring>::ZERO, |v| v.acc())
    };
    // Outputs with no term (all in the padding) hold their bias.
    for (y, o) in out.iter_mut().enumerate() {
        *o = T::of_acc(bias_of(y));
    }
    let mut flush = |out: &mut [T], (y, acc): (usize, T::Acc)| match out.get_mut(y) {
        Some(o) => *o = T::of_acc(acc),
        None => ok = false,
    };
    connections(g, |xi, yi, wi| {
        let term = match (x.get(xi), w.get(wi)) {
            (Some(a), Some(b)) => a.acc() * b.acc(),
            _ => <T::Acc as Ring>::ZERO,
        };
        current = match current {
            Some((y, acc)) if y == yi => Some((y, acc + term)),
            Some(done) => {
                flush(out, done);
                Some((yi, bias_of(yi) + term))
            }
            None => Some((yi, bias_of(yi) + term)),
        };
    });
    if let Some(done) = current {
        flush(out, done);
    }
    if ok {
        Ok(())
    } else {
        Err(oob())
    }
}

/// `convolution_backward.out(grad_output, input, weight, bias_sizes?, stride, padding,
/// dilation, transposed, output_padding, groups, output_mask, grad_input, grad_weight,
/// grad_bias)`: the gradients `output_mask` asks for, accumulated in `f64`.
fn convolution_backward(args: &mut Args<'_>) -> KernelResult {
    let (g, out_sizes) = geometry(args, BACKWARD)?;
    let go = args.info(0)?;
    if go.sizes != out_sizes {
        return Err(invalid(format!(
            "grad_output of shape {:?}, the convolution gives {:?}",
            go.sizes.as_slice(),
            out_sizes.as_slice()
        )));
    }
    let mask = args.bool_list(10)?;
    let &[want_x, want_w, want_b] = mask else {
        return Err(invalid(format!("output_mask needs 3 values, got {mask:?}")));
    };
    let dtype = go.dtype;
    for i in [1, 2] {
        if args.info(i)?.dtype != dtype {
            return Err(KernelError::dtypes(&[dtype, args.info(i)?.dtype]));
        }
    }
    let mut writes = SmallVec::<[Arg; 3]>::new();
    for (want, out, like) in [(want_x, 11, 1), (want_w, 12, 2)] {
        if want {
            let sizes = args.tensor(like)?.sizes;
            args.resize(out, &sizes)?;
            writes.push(Arg::At(out));
        }
    }
    if want_b {
        args.resize(13, &[g.c_out])?;
        writes.push(Arg::At(13));
    }
    for &w in &writes {
        if args.info(w)?.dtype != dtype {
            return Err(KernelError::dtypes(&[dtype, args.info(w)?.dtype]));
        }
    }
    let (nx, nw) = (args.info(1)?.numel(), args.info(2)?.numel());
    let pieces = [Scratch::piece::<f64>(nx), Scratch::piece::<f64>(nw)];
    let reads = [Arg::At(0), Arg::At(1), Arg::At(2)];
    let mut io = Dense::io(args, &reads, &writes, &pieces)?;
    let (dx, dw) = (io.scratch.take::<f64>(nx)?, io.scratch.take::<f64>(nw)?);
    dx.fill(0.0);
    dw.fill(0.0);
    crate::dispatch_float!(dtype, T => {
        let (gy, x, w) = (io.input::<T>(0)?, io.input::<T>(1)?, io.input::<T>(2)?);
        let at = |s: &[T], i: usize| s.get(i).map_or(0.0, |v| v.to_f64());
        connections(&g, |xi, yi, wi| {
            let d = at(gy, yi);
            if let Some(v) = dx.get_mut(xi) {
                *v += d * at(w, wi);
            }
            if let Some(v) = dw.get_mut(wi) {
                *v += d * at(x, xi);
            }
        });
        let mut k = 0;
        for (want, grads) in [(want_x, &*dx), (want_w, &*dw)] {
            if want {
                for (o, &v) in io.output::<T>(k)?.iter_mut().zip(grads) {
                    *o = T::from_f64(v);
                }
                k += 1;
            }
        }
        if want_b {
            let ohw = g.output[0] * g.output[1];
            let db = io.output::<T>(k)?;
            db.fill(T::default());
            for (p, plane) in gy.chunks_exact(ohw.max(1)).enumerate() {
                if let Some(o) = db.get_mut(p % g.c_out.max(1)) {
                    *o = T::from_f64(o.to_f64() + plane.iter().map(|v| v.to_f64()).sum::<f64>());
                }
            }
        }
    }, return Err(KernelError::dtypes(&[dtype])));
    io.finish()
}

/// Registers `aten::convolution.out` and `aten::convolution_backward.out`.
pub fn register(r: &mut KernelRegistry) {
    r.register("aten::convolution.out", Stateful(convolution));
    r.register_fn("aten::convolution_backward.out", convolution_backward);
}
