//! 2-d pooling over the last two dims of (N, C, H, W) or (C, H, W) inputs:
//! `max_pool2d_with_indices`, `avg_pool2d` and `_adaptive_avg_pool2d`, with PyTorch's
//! output sizes (ceil mode included) and divisors. Output planes are independent and are
//! split over threads when there is enough work.

use std::iter::StepBy;
use std::ops::Range;

use pte_runtime::{Args, DType, Dims, KernelError, KernelRegistry, KernelResult, TensorInfo};
use rayon::prelude::*;
use smallvec::SmallVec;

use super::{for_each_chunk, spatial_pair, valid_range, Float, Real};
use crate::linalg::PARALLEL_WORK;

/// The input seen as planes of `h × w` behind leading dims `lead`.
struct Planes {
    h: usize,
    w: usize,
    lead: Dims,
}

impl Planes {
    fn of(x: &TensorInfo) -> KernelResult<Self> {
        match x.sizes.as_slice() {
            [lead @ .., h, w] if (1..=2).contains(&lead.len()) && *h > 0 && *w > 0 => Ok(Self {
                h: *h,
                w: *w,
                lead: lead.into(),
            }),
            s => Err(KernelError::invalid(format!(
                "pooling needs a (C, H, W) or (N, C, H, W) input with non-empty H and W, got {s:?}"
            ))),
        }
    }

    /// Output sizes for `oh × ow` planes.
    fn out_sizes(&self, oh: usize, ow: usize) -> Dims {
        let mut s = self.lead.clone();
        s.extend_from_slice(&[oh, ow]);
        s
    }
}

/// One axis of a pooling window.
#[derive(Clone, Copy)]
struct Axis {
    input: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    output: usize,
}

impl Axis {
    /// Checks the window and computes the output length as PyTorch's
    /// `pooling_output_shape` (a ceil-mode window must start inside the input or its
    /// left padding).
    fn new(
        input: usize,
        kernel: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
        ceil: bool,
    ) -> KernelResult<Self> {
        if kernel == 0 || stride == 0 || dilation == 0 {
            return Err(KernelError::invalid(format!(
                "kernel size {kernel}, stride {stride} and dilation {dilation} must be positive"
            )));
        }
        if pad > kernel / 2 {
            return Err(KernelError::invalid(format!(
                "padding {pad} must be at most half the kernel size {kernel}"
            )));
        }
        let (i, k, s, p, d) = (
            input as i128,
            kernel as i128,
            stride as i128,
            pad as i128,
            dilation as i128,
        );
        let span = i + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
        let mut out = span.div_euclid(s) + 1;
        if ceil && (out - 1) * s >= i + p {
            out -= 1;
        }
        if out < 1 {
            return Err(KernelError::invalid(format!(
                "pooling an input of {input} with kernel {kernel}, stride {stride}, padding {pad}, dilation {dilation} leaves no output"
            )));
        }
        let output = usize::try_from(out)
            .map_err(|_| KernelError::invalid("pooling output is too large"))?;
        Ok(Self {
            input,
            kernel,
            stride,
            pad,
            dilation,
            output,
        })
    }

    /// First tap of output `o`'s window, in padded coordinates shifted by `-pad`.
    fn start(&self, o: usize) -> i128 {
        (o * self.stride) as i128 - self.pad as i128
    }

    /// Input positions read by output `o`'s dilated window.
    fn taps(&self, o: usize) -> StepBy<Range<usize>> {
        let (start, d) = (self.start(o), self.dilation as i128);
        let first = if start < 0 {
            start + (-start + d - 1) / d * d
        } else {
            start
        };
        let end = (start + (self.kernel as i128 - 1) * d + 1).min(self.input as i128);
        (first as usize..end.max(first) as usize).step_by(self.dilation)
    }

    /// Input range of output `o`'s (undilated) averaging window and the window's size
    /// counting padding, but not the part past the padding that ceil mode adds.
    fn average(&self, o: usize) -> (Range<usize>, usize) {
        let start = self.start(o);
        let end = (start + self.kernel as i128).min((self.input + self.pad) as i128);
        let padded = (end - start) as usize;
        let lo = start.max(0) as usize;
        (
            lo..(end.min(self.input as i128).max(lo as i128)) as usize,
            padded,
        )
    }
}

/// `kernel_size`, `stride` (empty: the kernel size) and `padding` at `first..first + 3`.
fn window_args(args: &Args<'_>, first: usize) -> KernelResult<[[usize; 2]; 3]> {
    let kernel = spatial_pair(&args.int_list(first)?, 2, "kernel_size", 1)?;
    let stride = args.int_list(first + 1)?;
    let stride = if stride.is_empty() {
        kernel
    } else {
        spatial_pair(&stride, 2, "stride", 1)?
    };
    Ok([
        kernel,
        stride,
        spatial_pair(&args.int_list(first + 2)?, 2, "padding", 0)?,
    ])
}

fn check_dtypes(dtypes: &[DType]) -> KernelResult {
    if dtypes.iter().all(|&d| d == dtypes[0]) {
        Ok(())
    } else {
        Err(KernelError::dtypes(dtypes))
    }
}

/// `max_pool2d_with_indices.out(self, kernel_size, stride, padding, dilation, ceil_mode,
/// out, indices)`: the maximum of each window (NaN wins) and its flat index `y·W + x`
/// within the plane.
fn max_pool2d_with_indices(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let p = Planes::of(&x)?;
    let [kernel, stride, pad] = window_args(args, 1)?;
    let dilation = spatial_pair(&args.int_list(4)?, 2, "dilation", 1)?;
    let ceil = args.bool(5)?;
    let ay = Axis::new(p.h, kernel[0], stride[0], pad[0], dilation[0], ceil)?;
    let ax = Axis::new(p.w, kernel[1], stride[1], pad[1], dilation[1], ceil)?;
    check_dtypes(&[x.dtype, args.tensor(6)?.dtype])?;
    if args.tensor(7)?.dtype != DType::I64 {
        return Err(KernelError::dtypes(&[x.dtype, args.tensor(7)?.dtype]));
    }
    let sizes = p.out_sizes(ay.output, ax.output);
    args.resize(6, &sizes)?;
    args.resize(7, &sizes)?;
    let mut io = args.io(&[0.into()], &[6.into(), 7.into()])?;
    let (values, indices) = io.outputs.split_at_mut(1);
    let indices = indices[0].as_mut_slice::<i64>()?;
    crate::dispatch_float!(x.dtype, T => {
        max_pool(io.inputs[0].as_slice::<T>()?, values[0].as_mut_slice::<T>()?, indices, &p, ay, ax);
        Ok(())
    }, Err(KernelError::dtypes(&[x.dtype])))
}

fn max_pool<T: Float>(
    x: &[T],
    values: &mut [T],
    indices: &mut [i64],
    p: &Planes,
    ay: Axis,
    ax: Axis,
) {
    /// Outputs of a row handled at once.
    const LANES: usize = 128;
    let (hw, ohw) = (p.h * p.w, ay.output * ax.output);
    // The outputs each kernel column reaches inside the input, the same for every row.
    let columns: SmallVec<[(usize, usize); 16]> = (0..ax.kernel)
        .map(|kx| valid_range(ax.output, ax.input, kx * ax.dilation, ax.stride, ax.pad))
        .collect();
    // Taps are visited in row-major order for each output (rows, then kernel columns,
    // with the outputs of a row innermost so that they run independently).
    let plane = |(i, (vals, idxs)): (usize, (&mut [T], &mut [i64]))| {
        let src = &x[i * hw..][..hw];
        let mut best = [<T::Acc as Real>::NEG_INFINITY; LANES];
        let mut best_at = [-1i64; LANES];
        let outs = vals.chunks_mut(ax.output).zip(idxs.chunks_mut(ax.output));
        for (oy, (vrow, irow)) in outs.enumerate() {
            let chunks = vrow.chunks_mut(LANES).zip(irow.chunks_mut(LANES));
            for (chunk, (vs, is)) in chunks.enumerate() {
                let (x0, n) = (chunk * LANES, vs.len());
                let (best, best_at) = (&mut best[..n], &mut best_at[..n]);
                best.fill(<T::Acc as Real>::NEG_INFINITY);
                best_at.fill(-1);
                for y in ay.taps(oy) {
                    let row = &src[y * p.w..][..p.w];
                    for (kx, &(lo, hi)) in columns.iter().enumerate() {
                        let first = kx * ax.dilation;
                        let (lo, hi) = (lo.max(x0), hi.min(x0 + n));
                        if lo >= hi {
                            continue;
                        }
                        let mut xi = lo * ax.stride + first - ax.pad;
                        let runs = best[lo - x0..hi - x0]
                            .iter_mut()
                            .zip(&mut best_at[lo - x0..hi - x0]);
                        for (b, at) in runs {
                            let val = row[xi].acc();
                            if val > *b || val.is_nan() {
                                *b = val;
                                *at = (y * p.w + xi) as i64;
                            }
                            xi += ax.stride;
                        }
                    }
                }
                for (k, ((v, idx), (&b, &at))) in vs
                    .iter_mut()
                    .zip(is.iter_mut())
                    .zip(best.iter().zip(best_at.iter()))
                    .enumerate()
                {
                    *v = T::of_acc(b);
                    // Nothing beat -inf: PyTorch reports the window's first tap.
                    *idx = if at >= 0 {
                        at
                    } else {
                        let first = |mut taps: StepBy<Range<usize>>| taps.next().unwrap_or(0);
                        (first(ay.taps(oy)) * p.w + first(ax.taps(x0 + k))) as i64
                    };
                }
            }
        }
    };
    if values
        .len()
        .saturating_mul(ay.kernel.saturating_mul(ax.kernel))
        >= PARALLEL_WORK
    {
        values
            .par_chunks_mut(ohw)
            .zip(indices.par_chunks_mut(ohw))
            .enumerate()
            .for_each(plane);
    } else {
        values
            .chunks_mut(ohw)
            .zip(indices.chunks_mut(ohw))
            .enumerate()
            .for_each(plane);
    }
}

/// `avg_pool2d.out(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
/// divisor_override, out)`. A window is clipped to the input; its divisor is the override
/// if given, else its size including padding (`count_include_pad`) or not.
fn avg_pool2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let p = Planes::of(&x)?;
    let [kernel, stride, pad] = window_args(args, 1)?;
    let (ceil, include_pad) = (args.bool(4)?, args.bool(5)?);
    let divisor = match args.opt_int(6)? {
        Some(0) => return Err(KernelError::invalid("divisor_override must not be zero")),
        d => d,
    };
    let ay = Axis::new(p.h, kernel[0], stride[0], pad[0], 1, ceil)?;
    let ax = Axis::new(p.w, kernel[1], stride[1], pad[1], 1, ceil)?;
    check_dtypes(&[x.dtype, args.tensor(7)?.dtype])?;
    args.resize(7, &p.out_sizes(ay.output, ax.output))?;
    let mut io = args.io(&[0.into()], &[7.into()])?;
    crate::dispatch_float!(x.dtype, T => {
        let src = io.inputs[0].as_slice::<T>()?;
        average(src, io.outputs[0].as_mut_slice::<T>()?, &p, ay.output, ax.output, |oy, ox| {
            let ((ys, ph), (xs, pw)) = (ay.average(oy), ax.average(ox));
            let size = ys.len() * xs.len();
            let div = match divisor {
                Some(d) => d as f64,
                None if include_pad => (ph * pw) as f64,
                None => size as f64,
            };
            (ys, xs, if size == 0 { None } else { Some(div) })
        });
        Ok(())
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// `_adaptive_avg_pool2d.out(self, output_size, out)`: output `i` of `n` averages inputs
/// `floor(i·in/n)..ceil((i+1)·in/n)`.
fn adaptive_avg_pool2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let p = Planes::of(&x)?;
    let [oh, ow] = spatial_pair(&args.int_list(1)?, 2, "output_size", 1)?;
    check_dtypes(&[x.dtype, args.tensor(2)?.dtype])?;
    args.resize(2, &p.out_sizes(oh, ow))?;
    let mut io = args.io(&[0.into()], &[2.into()])?;
    let bin = |o: usize, out: usize, input: usize| {
        let (o, out, input) = (o as u128, out as u128, input as u128);
        (o * input / out) as usize..((o + 1) * input).div_ceil(out) as usize
    };
    crate::dispatch_float!(x.dtype, T => {
        let src = io.inputs[0].as_slice::<T>()?;
        average(src, io.outputs[0].as_mut_slice::<T>()?, &p, oh, ow, |oy, ox| {
            let (ys, xs) = (bin(oy, oh, p.h), bin(ox, ow, p.w));
            let size = (ys.len() * xs.len()) as f64;
            (ys, xs, Some(size))
        });
        Ok(())
    }, Err(KernelError::dtypes(&[x.dtype])))
}

/// Writes each output the mean of its window: `window(oy, ox)` gives the input rows and
/// columns and the divisor (None: the window is empty and the output 0).
fn average<T: Float>(
    x: &[T],
    out: &mut [T],
    p: &Planes,
    oh: usize,
    ow: usize,
    window: impl Fn(usize, usize) -> (Range<usize>, Range<usize>, Option<f64>) + Sync + Send,
) {
    let hw = p.h * p.w;
    let work = out.len() * (hw / (oh * ow).max(1)).max(1);
    for_each_chunk(out, oh * ow, work, |i, plane| {
        let src = &x[i * hw..][..hw];
        for (k, o) in plane.iter_mut().enumerate() {
            let (ys, xs, div) = window(k / ow, k % ow);
            *o = match div {
                Some(div) => {
                    let mut sum = <T::Acc as Real>::ZERO;
                    for y in ys {
                        for v in &src[y * p.w..][xs.clone()] {
                            sum += v.acc();
                        }
                    }
                    T::of_acc(sum / <T::Acc as Real>::of(div))
                }
                None => T::default(),
            };
        }
    });
}

/// Registers the pooling kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::max_pool2d_with_indices.out", max_pool2d_with_indices);
    r.register_fn("aten::avg_pool2d.out", avg_pool2d);
    r.register_fn("aten::_adaptive_avg_pool2d.out", adaptive_avg_pool2d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lengths_follow_pytorch() {
        // 7 inputs, kernel 3, stride 2, padding 1: 4 outputs; ceil mode on 6 inputs with
        // kernel 3 stride 2 gives 3 (the last window starts inside the input).
        assert_eq!(Axis::new(7, 3, 2, 1, 1, false).unwrap().output, 4);
        assert_eq!(Axis::new(6, 3, 2, 0, 1, true).unwrap().output, 3);
        assert_eq!(Axis::new(6, 3, 2, 0, 1, false).unwrap().output, 2);
        assert!(Axis::new(2, 3, 1, 0, 1, false).is_err());
        assert!(Axis::new(8, 2, 2, 2, 1, false).is_err());
        let a = Axis::new(5, 3, 2, 1, 2, false).unwrap();
        assert_eq!(a.taps(0).collect::<Vec<_>>(), vec![1, 3]);
        let avg = Axis::new(6, 3, 2, 1, 1, true).unwrap();
        assert_eq!(avg.output, 4);
        // Last window starts at 5: clipped to 5..6, its padded size 7 - 5 = 2.
        assert_eq!(avg.average(3), (5..6, 2));
        assert_eq!(avg.average(0), (0..2, 3));
    }
}
