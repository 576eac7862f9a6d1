//! Depthwise convolution in NCHW: each output plane filters one input plane.
//!
//! Per output row, the row starts at the bias; each kernel tap then adds a scaled run of
//! an input row to the run of outputs it reaches (a vectorized multiply-add over the
//! output width). With a horizontal stride the input row is first split into its
//! phases (`x[p], x[p + s], ...`) so that every tap reads a contiguous run. The
//! activation runs on the finished row. Planes are split over the pool's threads.

use super::Conv2dParams;
use crate::arch::Isa;
use crate::elementwise::Activation;
use crate::error::{Error, Result};
use crate::pool::ThreadPool;
use crate::window::{self, Window};

pub(crate) struct Layer<'a> {
    pub p: &'a Conv2dParams,
    pub out: [usize; 2],
    pub weights: &'a [f32],
    pub bias: &'a [f32],
    pub activation: Activation,
}

/// The window of a depthwise layer.
pub(crate) fn window(p: &Conv2dParams, out: [usize; 2]) -> Window {
    Window::new(
        p.input,
        p.kernel,
        p.stride,
        p.dilation,
        [p.padding[0], p.padding[1]],
        out,
    )
}

pub(crate) fn scratch_len(p: &Conv2dParams, out: [usize; 2], threads: usize) -> Result<usize> {
    let per = window(p, out).scratch().ok_or(Error::SizeOverflow {
        what: "depthwise scratch",
    })?;
    crate::error::mul(per, threads, "depthwise scratch")
}

pub(crate) fn run(
    isa: Isa,
    pool: &ThreadPool,
    l: &Layer<'_>,
    x: &[f32],
    y: &mut [f32],
    scratch: &mut [f32],
) -> Result {
    let p = l.p;
    let ([h, w], [oh, ow]) = (p.input, l.out);
    let (plane_in, plane_out) = (h * w, oh * ow);
    let mult = p.out_channels / p.groups;
    let taps = p.kernel[0] * p.kernel[1];
    if plane_out == 0 {
        return Ok(());
    }
    let failed = crate::pool::FirstError::default();
    let g = window(p, l.out);
    let per_thread = g.scratch().ok_or(Error::SizeOverflow {
        what: "depthwise scratch",
    })?;
    pool.parallel_chunks(y, plane_out, scratch, per_thread, |plane, out, rows| {
        let oc = plane % p.out_channels;
        let ic = plane / p.out_channels * p.in_channels + oc / mult;
        let (Some(src), Some(wt)) = (
            x.get(ic * plane_in..(ic + 1) * plane_in),
            l.weights.get(oc * taps..(oc + 1) * taps),
        ) else {
            failed.keep(Err(Error::InvalidParameter {
                what: "depthwise input too short".into(),
            }));
            return;
        };
        let bias = l.bias.get(oc).copied().unwrap_or(0.0);
        window::weighted(isa, &g, src, wt, bias, l.activation, out, rows);
    })?;
    failed.into_result()
}
