//! 2-d pooling over the last two dims of (N, C, H, W) or (C, H, W) inputs of any dim
//! order: `max_pool2d_with_indices` (every real dtype), `avg_pool2d` (floats and
//! integers, which divide with truncation as PyTorch) and `_adaptive_avg_pool2d`, with
//! PyTorch's output sizes (ceil mode included) and divisors. Output planes are
//! independent and are split over the pool's threads when there is enough work.

use pte_runtime::{Args, DType, Dims, KernelError, KernelRegistry, KernelResult, TensorInfo};

use super::spatial_pair;
use crate::layout::Dense;
use crate::num::Elem;
use crate::util::{for_each_chunk, Checked, Scratch};

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

    /// Output `o`'s window as `[first, end, padded, 0]`: its taps are every `dilation`-th
    /// position in `first..end` (clipped to the input), `padded` is the size of its
    /// (undilated) window counting padding but not the part past the padding that ceil
    /// mode adds, as PyTorch's average pooling divides by.
    fn span(&self, o: usize) -> [usize; 4] {
        let (s, d) = (o * self.stride, self.dilation);
        // Taps before the input (in the left padding) are skipped, a whole step at a time.
        let first = match self.pad.checked_sub(s) {
            Some(before) => before.div_ceil(d) * d + s - self.pad,
            None => s - self.pad,
        };
        let reach = s + (self.kernel - 1) * d + 1;
        let end = reach.saturating_sub(self.pad).min(self.input).max(first);
        let window_end = (s + self.kernel).min(self.input + 2 * self.pad);
        [first, end, window_end.saturating_sub(s), 0]
    }

    /// [`Axis::span`] of every output into `out`.
    fn spans(&self, out: &mut [[usize; 4]]) {
        for (o, span) in out.iter_mut().enumerate() {
            *span = self.span(o);
        }
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
    if dtypes.windows(2).all(|w| w.first() == w.last()) {
        Ok(())
    } else {
        Err(KernelError::dtypes(dtypes))
    }
}

/// True when `x` is NaN (never for integers).
#[allow(clippy::eq_op)]
fn is_nan<T: PartialEq>(x: T) -> bool {
    x != x
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
    check_dtypes(&[x.dtype, args.info(6)?.dtype])?;
    if args.info(7)?.dtype != DType::I64 {
        return Err(KernelError::dtypes(&[x.dtype, args.info(7)?.dtype]));
    }
    let sizes = p.out_sizes(ay.output, ax.output);
    args.resize(6, &sizes)?;
    args.resize(7, &sizes)?;
    let pool = args.pool();
    let pieces = [
        Scratch::piece::<[usize; 4]>(ay.output),
        Scratch::piece::<[usize; 4]>(ax.output),
    ];
    let mut io = Dense::io(args, &[0.into()], &[6.into(), 7.into()], &pieces)?;
    let (ys, xs) = (io.scratch.take(ay.output)?, io.scratch.take(ax.output)?);
    ay.spans(ys);
    ax.spans(xs);
    let (ys, xs): (&[[usize; 4]], &[[usize; 4]]) = (ys, xs);
    let (hw, ohw) = (p.h * p.w, ay.output * ax.output);
    crate::dispatch_all!(x.dtype, T => {
        let src = io.input::<T>(0)?;
        let (values, indices) = io.outputs2::<T, i64>()?;
        let work = indices.len().saturating_mul(ay.kernel * ax.kernel);
        // The index of each window's maximum (PyTorch's rule: a larger value or a NaN
        // replaces the current one), plane by plane; then the values at those indices.
        for_each_chunk(pool, indices, ohw, work, |i, plane| {
            let src = src.get(i * hw..(i + 1) * hw).unwrap_or_default();
            let outputs = ys.iter().flat_map(|y| xs.iter().map(move |x| (y, x)));
            for (at, (&[y0, y1, ..], &[x0, x1, ..])) in plane.iter_mut().zip(outputs) {
                let mut best: Option<(T, usize)> = None;
                for y in (y0..y1).step_by(ay.dilation) {
                    let row = src.get(y * p.w..(y + 1) * p.w).unwrap_or_default();
                    for xi in (x0..x1).step_by(ax.dilation) {
                        let Some(&v) = row.get(xi) else { continue };
                        if best.is_none_or(|(b, _)| v > b || is_nan(v)) {
                            best = Some((v, y * p.w + xi));
                        }
                    }
                }
                *at = best.map_or(0, |(_, k)| k as i64);
            }
        })?;
        for (i, (vs, is)) in values.chunks_mut(ohw).zip(indices.chunks(ohw)).enumerate() {
            let plane = src.span(i * hw, hw)?;
            for (v, &k) in vs.iter_mut().zip(is) {
                *v = *plane.at(usize::try_from(k).map_err(|_| crate::util::oob())?)?;
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `max_pool2d_with_indices_backward.grad_input(grad_output, self, kernel_size, stride,
/// padding, dilation, ceil_mode, indices, grad_input)`: each gradient added to the input
/// element its window's maximum came from (`indices`), the rest zero (PyTorch clears the
/// output first; upstream accumulates into it).
fn max_pool2d_backward(args: &mut Args<'_>) -> KernelResult {
    let (go, x, idx) = (args.tensor(0)?, args.tensor(1)?, args.tensor(7)?);
    let p = Planes::of(&x)?;
    let planes = crate::util::prod(&p.lead);
    let (hw, ohw) = (p.h * p.w, go.numel() / planes.max(1));
    if idx.sizes != go.sizes || idx.dtype != DType::I64 || go.numel() != planes * ohw {
        return Err(KernelError::invalid(format!(
            "max_pool2d_with_indices_backward: grad_output {:?} and int64 indices {:?} must match, with the input's {planes} planes",
            go.sizes.as_slice(),
            idx.sizes.as_slice()
        )));
    }
    check_dtypes(&[go.dtype, x.dtype, args.info(8)?.dtype])?;
    args.resize(8, &x.sizes)?;
    let mut io = Dense::io(args, &[0.into(), 7.into()], &[8.into()], &[])?;
    let indices = io.input::<i64>(1)?;
    crate::dispatch_float!(x.dtype, T => {
        let grads = io.input::<T>(0)?;
        let out = io.output::<T>(0)?;
        out.fill(T::default());
        let planes = out.chunks_exact_mut(hw.max(1)).zip(grads.chunks(ohw.max(1)).zip(indices.chunks(ohw.max(1))));
        for (plane, (g, i)) in planes {
            for (&g, &i) in g.iter().zip(i) {
                let slot = usize::try_from(i).ok().and_then(|i| plane.get_mut(i)).ok_or_else(|| {
                    KernelError::invalid(format!(
                        "max_pool2d_with_indices_backward: index {i} is outside a plane of {hw}"
                    ))
                })?;
                *slot = T::of_acc(slot.acc() + g.acc());
            }
        }
    }, return Err(KernelError::dtypes(&[x.dtype])));
    io.finish()
}

/// `avg_pool2d.out(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
/// divisor_override, out)`. A window is clipped to the input; its divisor is the override
/// if given, else its size including padding (`count_include_pad`) or not.
fn avg_pool2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let p = Planes::of(x)?;
    let [kernel, stride, pad] = window_args(args, 1)?;
    let (ceil, include_pad) = (args.bool(4)?, args.bool(5)?);
    let divisor = match args.opt_int(6)? {
        Some(0) => return Err(KernelError::invalid("divisor_override must not be zero")),
        d => d,
    };
    let ay = Axis::new(p.h, kernel[0], stride[0], pad[0], 1, ceil)?;
    let ax = Axis::new(p.w, kernel[1], stride[1], pad[1], 1, ceil)?;
    check_dtypes(&[x.dtype, args.info(7)?.dtype])?;
    args.resize(7, &p.out_sizes(ay.output, ax.output))?;
    let divisor = |[y0, y1, ph, _]: [usize; 4], [x0, x1, pw, _]: [usize; 4]| {
        let size = (y1 - y0) * (x1 - x0);
        let div = match divisor {
            Some(d) => d,
            None if include_pad => (ph * pw) as i64,
            None => size as i64,
        };
        (size != 0).then_some(div)
    };
    average(args, &p, [ay, ax], 7, divisor)
}

/// `_adaptive_avg_pool2d.out(self, output_size, out)`: output `i` of `n` averages inputs
/// `floor(i·in/n)..ceil((i+1)·in/n)`.
fn adaptive_avg_pool2d(args: &mut Args<'_>) -> KernelResult {
    let x = args.info(0)?;
    let p = Planes::of(x)?;
    let [oh, ow] = spatial_pair(&args.int_list(1)?, 2, "output_size", 1)?;
    check_dtypes(&[x.dtype, args.info(2)?.dtype])?;
    if !x.dtype.is_float() {
        return Err(KernelError::dtypes(&[x.dtype]));
    }
    args.resize(2, &p.out_sizes(oh, ow))?;
    // Output `o` of `n` averages inputs `floor(o·in/n)..ceil((o+1)·in/n)`: windows of
    // varying size and start, which `Axis` cannot describe; they are spans too.
    let bins = |out: usize, input: usize| Bins { out, input };
    let divisor =
        |[y0, y1, ..]: [usize; 4], [x0, x1, ..]: [usize; 4]| Some(((y1 - y0) * (x1 - x0)) as i64);
    average(args, &p, [bins(oh, p.h), bins(ow, p.w)], 2, divisor)
}

/// The windows of one axis of a pooling: output count and each output's span.
trait Windows {
    fn outputs(&self) -> usize;
    fn spans(&self, out: &mut [[usize; 4]]);
}

impl Windows for Axis {
    fn outputs(&self) -> usize {
        self.output
    }
    fn spans(&self, out: &mut [[usize; 4]]) {
        Axis::spans(self, out);
    }
}

/// Adaptive pooling's windows: output `o` of `out` covers `floor(o·in/out)..ceil((o+1)·in/out)`.
struct Bins {
    out: usize,
    input: usize,
}

impl Windows for Bins {
    fn outputs(&self) -> usize {
        self.out
    }
    fn spans(&self, out: &mut [[usize; 4]]) {
        let (n, input) = (self.out as u128, self.input as u128);
        for (o, span) in out.iter_mut().enumerate() {
            let o = o as u128;
            let (a, b) = (
                (o * input / n) as usize,
                ((o + 1) * input).div_ceil(n) as usize,
            );
            *span = [a, b, b - a, 0];
        }
    }
}

/// Writes each output of `out` the mean of its window (the spans of `[ay, ax]`);
/// `divisor(y span, x span)` gives the divisor (None: the window is empty, the output 0).
fn average<W: Windows>(
    args: &mut Args<'_>,
    p: &Planes,
    [ay, ax]: [W; 2],
    out: usize,
    divisor: impl Fn([usize; 4], [usize; 4]) -> Option<i64> + Sync,
) -> KernelResult {
    let dtype = args.info(0)?.dtype;
    let pool = args.pool();
    let (oh, ow) = (ay.outputs(), ax.outputs());
    let pieces = [
        Scratch::piece::<[usize; 4]>(oh),
        Scratch::piece::<[usize; 4]>(ow),
    ];
    let mut io = Dense::io(args, &[0.into()], &[out.into()], &pieces)?;
    let (ys, xs) = (io.scratch.take(oh)?, io.scratch.take(ow)?);
    ay.spans(ys);
    ax.spans(xs);
    let (ys, xs): (&[[usize; 4]], &[[usize; 4]]) = (ys, xs);
    let hw = p.h * p.w;
    crate::dispatch_all!(dtype, T => {
        let src = io.input::<T>(0)?;
        let dst = io.output::<T>(0)?;
        let work = dst.len().saturating_mul((hw / (oh * ow).max(1)).max(1));
        for_each_chunk(pool, dst, oh * ow, work, |i, plane| {
            let src = src.get(i * hw..(i + 1) * hw).unwrap_or_default();
            let outputs = ys.iter().flat_map(|&y| xs.iter().map(move |&x| (y, x)));
            for (o, (y, x)) in plane.iter_mut().zip(outputs) {
                let rows = (y[0]..y[1]).filter_map(|r| src.get(r * p.w..(r + 1) * p.w));
                let values = rows.flat_map(|row| row.get(x[0]..x[1]).unwrap_or_default());
                *o = match divisor(y, x) {
                    Some(div) => mean(values.copied(), div),
                    None => T::default(),
                };
            }
        })?;
    }, return Err(KernelError::dtypes(&[dtype])));
    io.finish()
}

/// `Σ values / div`: in `f64` for floats, in `i64` with truncating division for integers
/// (as PyTorch's integer average pooling).
fn mean<T: Elem>(values: impl Iterator<Item = T>, div: i64) -> T {
    if T::FLOAT {
        T::from_f64(values.map(T::to_f64).sum::<f64>() / div as f64)
    } else {
        let sum = values.fold(0i64, |s, v| s.wrapping_add(v.to_i64()));
        T::from_i64(sum.checked_div(div).unwrap_or(0))
    }
}

/// Registers the pooling kernels.
pub fn register(r: &mut KernelRegistry) {
    r.register_fn("aten::max_pool2d_with_indices.out", max_pool2d_with_indices);
    r.register_fn(
        "aten::max_pool2d_with_indices_backward.grad_input",
        max_pool2d_backward,
    );
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
        // Output 0's taps: -1 (padding), 1, 3.
        assert_eq!(&a.span(0)[..2], &[1, 4]);
        let avg = Axis::new(6, 3, 2, 1, 1, true).unwrap();
        assert_eq!(avg.output, 4);
        // Last window starts at 5: clipped to 5..6, its padded size 7 - 5 = 2.
        assert_eq!(&avg.span(3)[..3], &[5, 6, 2]);
        assert_eq!(&avg.span(0)[..3], &[0, 2, 3]);
    }
}
