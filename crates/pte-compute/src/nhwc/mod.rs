//! f32 convolution and pooling on channels-last (NHWC) tensors, the layout of
//! XNNPACK-style graphs: an image is `[height, width, channels]`, a pixel's channels
//! contiguous.
//!
//! - [`ConvNhwc`]: a 2-D convolution as one matrix product per group, output pixels ×
//!   output channels: 1×1 stride-1 convolutions read the input as the left operand in
//!   place; others gather each output pixel's receptive field (contiguous channel runs
//!   per tap) straight into the product's packed panels (implicit im2col). Weights,
//!   `[out, kh, kw, in/groups]`, are packed once; bias and clamp run in the product's
//!   epilogue; rows of the output are written with the output's channel stride, so the
//!   result lands in NHWC directly.
//! - Depthwise convolutions ([`ConvNhwc`] with one input channel per group): for each
//!   output pixel, taps accumulate 16 channels at a time in registers (the pixel's
//!   input pointers form an indirection list, padding taps skipped), stored once
//!   through the clamp.
//! - [`DeconvNhwc`]: transposed convolution as a product per input pixel into a
//!   column buffer, then added into the output (col2im).
//! - [`pool2d`]: max and average pooling (average over the taps inside the image,
//!   as XNNPACK does), vectorized across channels the same way.

mod conv;
mod deconv;
mod pool;

pub use conv::ConvNhwc;
pub use deconv::DeconvNhwc;
pub use pool::{global_avg_pool, pool2d, PoolKind};

use crate::error::{Error, Result};

/// The geometry shared by convolutions and pooling, NHWC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Input height and width.
    pub input: [usize; 2],
    /// Kernel (window) height and width.
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Padding: top, right, bottom, left (XNNPACK's order).
    pub padding: [usize; 4],
}

impl Geometry {
    /// Output height and width: `(in + pads - dilated kernel) / stride + 1`, or an
    /// error when the dilated kernel does not fit the padded input.
    pub fn output(&self) -> Result<[usize; 2]> {
        let [pt, pr, pb, pl] = self.padding;
        let axis = |input: usize, pads: (usize, usize), k: usize, s: usize, d: usize| {
            if k == 0 || s == 0 || d == 0 {
                return Err(Error::InvalidParameter {
                    what: format!(
                        "kernel {:?}, stride {:?} and dilation {:?} must be positive",
                        self.kernel, self.stride, self.dilation
                    ),
                });
            }
            let padded = input
                .checked_add(pads.0)
                .and_then(|v| v.checked_add(pads.1))
                .ok_or(Error::SizeOverflow { what: "padding" })?;
            let extent = (k - 1)
                .checked_mul(d)
                .and_then(|v| v.checked_add(1))
                .ok_or(Error::SizeOverflow {
                    what: "dilated kernel",
                })?;
            if padded < extent {
                return Err(Error::InvalidParameter {
                    what: format!(
                        "dilated kernel of {extent} exceeds the padded input of {padded}"
                    ),
                });
            }
            Ok((padded - extent) / s + 1)
        };
        Ok([
            axis(
                self.input[0],
                (pt, pb),
                self.kernel[0],
                self.stride[0],
                self.dilation[0],
            )?,
            axis(
                self.input[1],
                (pl, pr),
                self.kernel[1],
                self.stride[1],
                self.dilation[1],
            )?,
        ])
    }

    /// Input row and column of output pixel `(oy, ox)` at tap `(ky, kx)`, if inside the
    /// image.
    #[inline(always)]
    pub fn source(&self, oy: usize, ox: usize, ky: usize, kx: usize) -> Option<(usize, usize)> {
        let y = (oy * self.stride[0] + ky * self.dilation[0]).checked_sub(self.padding[0])?;
        let x = (ox * self.stride[1] + kx * self.dilation[1]).checked_sub(self.padding[3])?;
        (y < self.input[0] && x < self.input[1]).then_some((y, x))
    }
}

#[cfg(test)]
mod tests;
