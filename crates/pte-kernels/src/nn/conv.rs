//! `aten::convolution.out`: 1-d and 2-d (a 1-d convolution is a 2-d one of height 1),
//! batched or not, grouped, depthwise and transposed.
//!
//! - Regular convolution: im2col, then one `gemm` per (batch entry, group, block of output
//!   pixels) writing the output directly, pre-filled with the bias. A 1×1 convolution with
//!   stride 1 and no padding multiplies the input in place, without im2col.
//! - Depthwise (one input channel per group): a direct loop that accumulates each kernel
//!   tap along an output row (a vectorizable multiply-add of contiguous runs; strided
//!   inputs are split into phases first), output planes split over threads.
//! - Transposed: `gemm` of the transposed weight into columns, then col2im adds them into
//!   the output, split over threads by output channel.
//!
//! The column buffer (built a block of output pixels at a time, about 4 MiB of float32 at
//! most for usual kernels) lives in the method's scratch memory (`Io::scratch`), shared
//! by all call sites and kept across executions, so a steady-state run allocates nothing.

use pte_runtime::{Arg, Args, Buffer, DType, Dims, KernelError, KernelRegistry, KernelResult};
use smallvec::SmallVec;

use super::{for_each_chunk, spatial_pair, valid_range, Float, Real};
use crate::linalg::{Gemm, Mat, MatMut};
use crate::util::to_size;

/// Sizes of one convolution; index 0 of each pair is the height, 1 the width.
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
    output: [usize; 2],
    transposed: bool,
}

fn invalid(msg: String) -> KernelError {
    KernelError::invalid(msg)
}

/// Output length of one axis.
fn output_len(g: &Geom, axis: usize, out_pad: usize) -> KernelResult<usize> {
    let (i, k, s, p, d) = (
        g.input[axis],
        g.kernel[axis],
        g.stride[axis],
        g.pad[axis],
        g.dilation[axis],
    );
    let overflow = || invalid("convolution sizes overflow".into());
    // Extent of the dilated kernel, d·(k - 1) + 1.
    let extent = d
        .checked_mul(k - 1)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(overflow)?;
    let pads = p.checked_mul(2).ok_or_else(overflow)?;
    if g.transposed {
        // (i - 1)·s - 2p + d·(k - 1) + output_padding + 1
        let full = (i - 1)
            .checked_mul(s)
            .and_then(|v| v.checked_add(extent))
            .and_then(|v| v.checked_add(out_pad))
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

/// `a · b` for buffer sizes.
fn size_mul(a: usize, b: usize) -> KernelResult<usize> {
    a.checked_mul(b)
        .ok_or_else(|| invalid("convolution buffer size overflows".into()))
}

/// Reads and checks the arguments; returns the geometry and the output sizes.
fn geometry(args: &Args<'_>) -> KernelResult<(Geom, Dims)> {
    let (x, w) = (args.tensor(0)?, args.tensor(1)?);
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
    let xs = &x.sizes[usize::from(batched)..];
    let input = if spatial == 2 {
        [xs[1], xs[2]]
    } else {
        [1, xs[1]]
    };
    let kernel = if spatial == 2 {
        [w.sizes[2], w.sizes[3]]
    } else {
        [1, w.sizes[2]]
    };
    let stride = spatial_pair(&args.int_list(3)?, spatial, "stride", 1)?;
    let pad = spatial_pair(&args.int_list(4)?, spatial, "padding", 0)?;
    let dilation = spatial_pair(&args.int_list(5)?, spatial, "dilation", 1)?;
    let transposed = args.bool(6)?;
    let out_pad_list = args.int_list(7)?;
    let out_pad = if out_pad_list.is_empty() {
        [0, 0]
    } else {
        spatial_pair(&out_pad_list, spatial, "output_padding", 0)?
    };
    let groups = to_size(args.int(8)?, "groups")?;
    if groups == 0 || stride.contains(&0) || dilation.contains(&0) || kernel.contains(&0) {
        return Err(invalid(format!(
            "groups ({groups}), stride {stride:?}, dilation {dilation:?} and kernel {kernel:?} must be positive"
        )));
    }
    let c_in = xs[0];
    let c_out = if transposed {
        if w.sizes[0] != c_in || c_in % groups != 0 {
            return Err(invalid(format!(
                "transposed weight {:?} does not fit {c_in} input channels in {groups} groups",
                w.sizes.as_slice()
            )));
        }
        if (0..2).any(|a| out_pad[a] >= stride[a].max(dilation[a])) || input.contains(&0) {
            return Err(invalid(format!(
                "output_padding {out_pad:?} must be smaller than stride or dilation, input {input:?} non-empty"
            )));
        }
        w.sizes[1]
            .checked_mul(groups)
            .ok_or_else(|| invalid("too many channels".into()))?
    } else {
        if w.sizes[1].checked_mul(groups) != Some(c_in) || w.sizes[0] % groups != 0 {
            return Err(invalid(format!(
                "weight {:?} does not fit {c_in} input channels in {groups} groups",
                w.sizes.as_slice()
            )));
        }
        w.sizes[0]
    };
    let mut g = Geom {
        batch: if batched { x.sizes[0] } else { 1 },
        c_in,
        c_out,
        groups,
        input,
        kernel,
        stride,
        pad,
        dilation,
        output: [0, 0],
        transposed,
    };
    g.output = [
        output_len(&g, 0, out_pad[0])?,
        output_len(&g, 1, out_pad[1])?,
    ];
    let mut sizes = Dims::new();
    if batched {
        sizes.push(g.batch);
    }
    sizes.push(c_out);
    sizes.extend_from_slice(&g.output[2 - spatial..]);
    Ok((g, sizes))
}

/// `len` elements of `T` from the method's scratch memory.
fn scratch<T: Float>(buf: &mut Buffer, len: usize) -> KernelResult<&mut [T]> {
    buf.slice_mut(len).map_err(|source| KernelError::Memory {
        what: "convolution working memory".into(),
        source,
    })
}

fn convolution(args: &mut Args<'_>) -> KernelResult {
    let (g, out_sizes) = geometry(args)?;
    let bias = args.opt_tensor(2)?;
    let dtype = args.tensor(0)?.dtype;
    let dtypes = [
        Some(dtype),
        Some(args.tensor(1)?.dtype),
        Some(args.tensor(9)?.dtype),
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
    let reads = [Arg::At(0), Arg::At(1), Arg::At(2)];
    let mut io = args.io(&reads[..2 + usize::from(bias.is_some())], &[Arg::At(9)])?;
    let buf = &mut *io.scratch;
    crate::dispatch_float!(dtype, T => {
        let x = io.inputs[0].as_slice::<T>()?;
        let w = io.inputs[1].as_slice::<T>()?;
        let b = match io.inputs.get(2) {
            Some(t) => Some(t.as_slice::<T>()?),
            None => None,
        };
        let out = io.outputs[0].as_mut_slice::<T>()?;
        if out.is_empty() {
            Ok(())
        } else if g.transposed {
            transposed(&g, x, w, b, out, buf)
        } else if g.groups > 1 && g.c_in == g.groups {
            depthwise(&g, x, w, b, out, buf)
        } else {
            im2col_conv(&g, x, w, b, out, buf)
        }
    }, Err(KernelError::dtypes(&[dtype])))
}

/// Elements of the column buffer filled at once (4 MiB of float32): bounds the buffer for
/// large images; smaller blocks measured slower (more, narrower products).
const COLUMN_BLOCK: usize = 1 << 20;

/// Regular (possibly grouped) convolution as products per batch entry and group:
/// `out[g] (c_out/groups × oh·ow) = weight[g] (c_out/groups × K) · columns (K × oh·ow)`,
/// the columns built a block of output pixels at a time.
fn im2col_conv<T: Float + Gemm>(
    g: &Geom,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    buf: &mut Buffer,
) -> KernelResult {
    let (cig, cog) = (g.c_in / g.groups, g.c_out / g.groups);
    let (hw, ohw) = (g.input[0] * g.input[1], g.output[0] * g.output[1]);
    let kk = cig * g.kernel[0] * g.kernel[1];
    let in_place = g.kernel == [1, 1] && g.stride == [1, 1] && g.pad == [0, 0];
    let block = if in_place {
        ohw
    } else {
        (COLUMN_BLOCK / kk.max(1)).clamp(64, ohw.max(64)).min(ohw)
    };
    let col = scratch::<T>(buf, if in_place { 0 } else { size_mul(kk, block)? })?;
    let one = T::of_acc(Real::ONE);
    for (b, out_b) in out.chunks_mut(g.c_out * ohw).enumerate() {
        let x_b = &x[b * g.c_in * hw..][..g.c_in * hw];
        for (gi, out_g) in out_b.chunks_mut(cog * ohw).enumerate() {
            let x_g = &x_b[gi * cig * hw..][..cig * hw];
            let lhs = Mat::row_major(&w[gi * cog * kk..], cog, kk)?;
            let beta = bias.map(|bs| {
                for (row, &v) in out_g.chunks_mut(ohw).zip(&bs[gi * cog..]) {
                    row.fill(v);
                }
                one
            });
            for c0 in (0..ohw).step_by(block) {
                let n = block.min(ohw - c0);
                let rhs = if in_place {
                    Mat::row_major(x_g, cig, hw)?
                } else {
                    let col = &mut col[..kk * n];
                    im2col(g, x_g, c0, col);
                    Mat::row_major(col, kk, n)?
                };
                let dst = MatMut::new(&mut out_g[c0..], cog, n, ohw, 1)?;
                T::gemm(dst, lhs, rhs, beta, one)?;
            }
        }
    }
    Ok(())
}

/// Lays out the receptive fields of output pixels `c0..` of `x` (channels × h × w) as the
/// columns of `col` ((channels·kh·kw) × pixels), zero where they reach into the padding.
fn im2col<T: Float>(g: &Geom, x: &[T], c0: usize, col: &mut [T]) {
    let ([h, w], [kh, kw], [_, ow]) = (g.input, g.kernel, g.output);
    let ([sh, sw], [ph, pw], [dh, dw]) = (g.stride, g.pad, g.dilation);
    let zero = T::default();
    let n = col.len() / (g.c_in / g.groups * kh * kw).max(1);
    let work = col.len();
    for_each_chunk(col, n, work, |r, row| {
        let (c, ky, kx) = (r / (kh * kw), r / kw % kh, r % kw);
        let plane = &x[c * h * w..][..h * w];
        let (lo, hi) = valid_range(ow, w, kx * dw, sw, pw);
        // The block starts and ends mid output row: fill it row segment by row segment.
        let (mut pixel, mut rest) = (c0, row);
        while !rest.is_empty() {
            let (oy, ox0) = (pixel / ow, pixel % ow);
            let (seg, tail) = rest.split_at_mut((ow - ox0).min(rest.len()));
            let (a, b) = (
                lo.clamp(ox0, ox0 + seg.len()) - ox0,
                hi.clamp(ox0, ox0 + seg.len()) - ox0,
            );
            match (oy * sh + ky * dh).checked_sub(ph).filter(|&iy| iy < h) {
                Some(iy) if a < b => {
                    seg[..a].fill(zero);
                    seg[b..].fill(zero);
                    gather(
                        &mut seg[a..b],
                        &plane[iy * w + (ox0 + a) * sw + kx * dw - pw..],
                        sw,
                    );
                }
                _ => seg.fill(zero),
            }
            pixel += seg.len();
            rest = tail;
        }
    });
}

/// `dst[i] = src[i * step]`.
fn gather<T: Copy>(dst: &mut [T], src: &[T], step: usize) {
    if step == 1 {
        dst.copy_from_slice(&src[..dst.len()]);
    } else {
        for (d, s) in dst.iter_mut().zip(src.iter().step_by(step)) {
            *d = *s;
        }
    }
}

/// Depthwise convolution: output channel `oc` filters input channel
/// `oc / (c_out / groups)` alone. Each kernel tap is a multiply-add of a contiguous run
/// of an input row into an accumulator row; with a horizontal stride `s`, the input rows
/// are first split into `s` phases (`x[p], x[p + s], ...`) so that runs stay contiguous.
fn depthwise<T: Float>(
    g: &Geom,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    buf: &mut Buffer,
) -> KernelResult {
    /// Output values accumulated at once, on the stack (a whole row, usually).
    const LANES: usize = 256;
    let ([h, wd], [kh, kw], [oh, ow]) = (g.input, g.kernel, g.output);
    let ([sh, sw], [ph, pw], [dh, dw]) = (g.stride, g.pad, g.dilation);
    // Phase p of a row holds its elements p, p + sw, ... at p·q.. (q per phase).
    let q = wd.div_ceil(sw);
    let row_len = q * sw;
    let rows: &[T] = if sw == 1 {
        x
    } else {
        let split = scratch::<T>(buf, size_mul(x.len() / wd.max(1), row_len)?)?;
        for_each_chunk(split, row_len, x.len(), |r, dst| {
            let src = &x[r * wd..][..wd];
            for (p, phase) in dst.chunks_mut(q).enumerate() {
                gather(phase, &src[p.min(wd)..], sw);
            }
        });
        split
    };
    let multiplier = g.c_out / g.groups;
    // The outputs each kernel column reaches inside the input, the same for every row.
    let columns: SmallVec<[(usize, usize); 16]> = (0..kw)
        .map(|kx| valid_range(ow, wd, kx * dw, sw, pw))
        .collect();
    let work = out.len().saturating_mul(kh * kw);
    for_each_chunk(out, oh * ow, work, |p, plane| {
        let oc = p % g.c_out;
        let src = &rows[(p / g.c_out * g.c_in + oc / multiplier) * h * row_len..][..h * row_len];
        let taps = &w[oc * kh * kw..][..kh * kw];
        let b0 = bias.map_or(<T::Acc as Real>::ZERO, |bs| bs[oc].acc());
        let mut lanes = [b0; LANES];
        for (oy, dst_row) in plane.chunks_mut(ow).enumerate() {
            for (chunk, dst) in dst_row.chunks_mut(LANES).enumerate() {
                let x0 = chunk * LANES;
                let acc = &mut lanes[..dst.len()];
                acc.fill(b0);
                for ky in 0..kh {
                    let Some(iy) = (oy * sh + ky * dh).checked_sub(ph).filter(|&iy| iy < h) else {
                        continue;
                    };
                    let row = &src[iy * row_len..][..row_len];
                    for (kx, &(lo, hi)) in columns.iter().enumerate() {
                        let (lo, hi) = (lo.max(x0), hi.min(x0 + dst.len()));
                        if lo < hi {
                            let start = lo * sw + kx * dw - pw;
                            let run = &row[start % sw * q + start / sw..][..hi - lo];
                            let t = taps[ky * kw + kx].acc();
                            for (a, v) in acc[lo - x0..hi - x0].iter_mut().zip(run) {
                                *a += t * v.acc();
                            }
                        }
                    }
                }
                for (d, &a) in dst.iter_mut().zip(acc.iter()) {
                    *d = T::of_acc(a);
                }
            }
        }
    });
    Ok(())
}

/// Transposed convolution: per batch entry and group, `columns (c_out/groups·kh·kw × h·w)
/// = weight[g]ᵀ · x[g]`, then col2im adds each column entry to the output it lands on.
fn transposed<T: Float + Gemm>(
    g: &Geom,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    buf: &mut Buffer,
) -> KernelResult {
    let (cig, cog) = (g.c_in / g.groups, g.c_out / g.groups);
    let (hw, ohw) = (g.input[0] * g.input[1], g.output[0] * g.output[1]);
    let kk = cog * g.kernel[0] * g.kernel[1];
    for (i, plane) in out.chunks_mut(ohw).enumerate() {
        plane.fill(bias.map_or(T::default(), |b| b[i % g.c_out]));
    }
    let col = scratch::<T>(buf, size_mul(kk, hw)?)?;
    let one = T::of_acc(Real::ONE);
    for (b, out_b) in out.chunks_mut(g.c_out * ohw).enumerate() {
        let x_b = &x[b * g.c_in * hw..][..g.c_in * hw];
        for (gi, out_g) in out_b.chunks_mut(cog * ohw).enumerate() {
            let lhs = Mat::row_major(&w[gi * cig * kk..], cig, kk)?.t();
            let rhs = Mat::row_major(&x_b[gi * cig * hw..], cig, hw)?;
            T::gemm(MatMut::row_major(col, kk, hw)?, lhs, rhs, None, one)?;
            col2im(g, col, out_g);
        }
    }
    Ok(())
}

/// Adds the columns (c·kh·kw × h·w) to the output planes (c × oh × ow).
fn col2im<T: Float>(g: &Geom, col: &[T], out: &mut [T]) {
    let ([h, wd], [kh, kw], [oh, ow]) = (g.input, g.kernel, g.output);
    let ([sh, sw], [ph, pw], [dh, dw]) = (g.stride, g.pad, g.dilation);
    for_each_chunk(out, oh * ow, col.len(), |c, plane| {
        for ky in 0..kh {
            for kx in 0..kw {
                let src = &col[((c * kh + ky) * kw + kx) * h * wd..][..h * wd];
                for (iy, src_row) in src.chunks(wd).enumerate() {
                    let Some(oy) = (iy * sh + ky * dh).checked_sub(ph).filter(|&o| o < oh) else {
                        continue;
                    };
                    let dst = &mut plane[oy * ow..][..ow];
                    for (ix, s) in src_row.iter().enumerate() {
                        if let Some(d) = (ix * sw + kx * dw)
                            .checked_sub(pw)
                            .and_then(|ox| dst.get_mut(ox))
                        {
                            *d = T::of_acc(d.acc() + s.acc());
                        }
                    }
                }
            }
        }
    });
}

/// Registers `aten::convolution.out`.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::convolution.out", convolution);
}
