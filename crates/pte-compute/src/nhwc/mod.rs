//! f32 convolution and pooling on channels-last (NHWC) tensors, the layout of
//! XNNPACK-style graphs: an image is `[height, width, channels]`, a pixel's channels
//! contiguous.
//!
//! - [`ConvNhwc`]: a 2-D convolution, weights given in PyTorch's, XNNPACK's regular
//!   or XNNPACK's depthwise layout ([`ConvWeights`]) and arranged once; residual and
//!   activation fused. Regular convolutions are indirect products (output pixels ×
//!   output channels on the GEMM micro-kernel's register tile, the left operand read
//!   in place through a list of rows: the pixel itself for 1×1 stride-1, one run of a
//!   group's channels per kernel tap otherwise, padding a zero row); a stem with few
//!   input channels reads whole kernel rows of a padded copy of the image instead.
//!   Output rows are split over threads, blocks of the weights' panels stay in L2.
//!   Regular 3×3 stride-1 convolutions on images large enough use Winograd's minimal
//!   filtering instead (F(4×4, 3×3) from 24×24 outputs, F(2×2, 3×3) from 12×12, at
//!   least 16 channels in and out): 2.25 or 4 products per output and channel pair
//!   instead of 9, one GEMM per tile position on the same micro-kernel. On
//!   resnet18's layers (1 thread, `bench nhwc-layer`) 56×56×64 went from 2.56 to
//!   1.47-1.57 ms, 28×28×128 from 2.52 to 1.03-1.11, 14×14×256 from 2.64 to 1.45-1.6;
//!   at 7×7×512 the product is faster (the transformed weights, 16/9 as large, cost
//!   more to stream than the multiplications they save).
//! - Depthwise convolutions (one input and one output channel per group): 3×3 and 5×5
//!   with channels a multiple of eight on a hand-written row kernel (16 or 8 channels
//!   per vector, one block of channels slid along the row at a time, inner pixels by
//!   groups of four, edge pixels one by one with their taps checked), other windows
//!   per pixel with 16 channels accumulated in registers per tap. A channel multiplier above 1 runs as a grouped product.
//!
//! Measured against the two NHWC convolutions this module replaced (one per caller)
//! on mobilenet_v2 and resnet18 layers and two stems, at 1 and 2 threads: 2-3× faster
//! on stems and depthwise rows of large images, 10-25% on resnet18's 56×56 and
//! 28×28 layers, within noise elsewhere (crate BENCHMARKS.md).
//! - [`DepthwiseChain`]: a depthwise convolution with the pointwise convolutions
//!   before and after it run band by band of rows, the expanded tensors kept in cache.
//! - [`DeconvNhwc`]: transposed convolution, output row by output row: each input
//!   row reaching it multiplied by a kernel row's weights and added in, or written
//!   in place when the width axis tiles (stride equal to the kernel).
//! - [`pool2d`]: max and average pooling (average over the taps inside the image,
//!   as XNNPACK does), vectorized across channels the same way.

mod chain;
mod conv;
mod deconv;
mod mix;
mod pool;

pub use crate::conv::{ConvWeights, WeightLayout};
pub use chain::DepthwiseChain;
pub use conv::ConvNhwc;
pub use deconv::DeconvNhwc;
pub use mix::ChannelMix;
pub use pool::{global_avg_pool, max_pool2d_q8, pool2d, PoolKind};

use crate::conv::Conv2dParams;
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

    /// The same geometry as [`Conv2dParams`] for a convolution of `in_channels` to
    /// `out_channels` in `groups` groups (its padding is top, left, bottom, right).
    pub fn conv2d(&self, in_channels: usize, out_channels: usize, groups: usize) -> Conv2dParams {
        let [top, right, bottom, left] = self.padding;
        Conv2dParams {
            in_channels,
            out_channels,
            groups,
            input: self.input,
            kernel: self.kernel,
            stride: self.stride,
            padding: [top, left, bottom, right],
            dilation: self.dilation,
        }
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
