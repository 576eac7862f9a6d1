//! Neural-network kernels: convolution ([`conv`]), pooling ([`pool`]), normalization
//! ([`norm`]) and softmax-like activations ([`activation`]).
//!
//! All compute in PyTorch's "opmath" type (`Float::Acc`: float32 for float16 and
//! bfloat16, else the element type itself) and split their work over Rayon threads by
//! plane or row once there is enough of it (`for_each_chunk`).

use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

use half::{bf16, f16};
use pte_runtime::{KernelError, KernelRegistry, KernelResult};
use rayon::prelude::*;

use crate::linalg::PARALLEL_WORK;
use crate::util::{to_size, Elem};

pub mod activation;
pub mod conv;
pub mod norm;
pub mod pool;

/// Arithmetic of a computation type (float32 or float64).
pub(crate) trait Real:
    bytemuck::Pod
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn is_nan(self) -> bool;
    /// Rounds an `f64` to this type.
    fn of(v: f64) -> Self;
}

macro_rules! real {
    ($($t:ident),*) => {$(
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            fn exp(self) -> Self { $t::exp(self) }
            fn ln(self) -> Self { $t::ln(self) }
            fn sqrt(self) -> Self { $t::sqrt(self) }
            fn is_nan(self) -> bool { $t::is_nan(self) }
            fn of(v: f64) -> Self { v as $t }
        }
    )*};
}
real!(f32, f64);

/// Floating-point element types and the type PyTorch computes them in.
pub(crate) trait Float: Elem + Send + Sync {
    type Acc: Real;
    fn acc(self) -> Self::Acc;
    fn of_acc(v: Self::Acc) -> Self;
}

impl Float for f32 {
    type Acc = f32;
    fn acc(self) -> f32 {
        self
    }
    fn of_acc(v: f32) -> Self {
        v
    }
}

impl Float for f64 {
    type Acc = f64;
    fn acc(self) -> f64 {
        self
    }
    fn of_acc(v: f64) -> Self {
        v
    }
}

macro_rules! half_float {
    ($($t:ident),*) => {$(
        impl Float for $t {
            type Acc = f32;
            fn acc(self) -> f32 { self.to_f32() }
            fn of_acc(v: f32) -> Self { $t::from_f32(v) }
        }
    )*};
}
half_float!(f16, bf16);

/// Calls `f(i, piece)` for each `chunk`-sized piece of `data` (the last may be shorter),
/// on several threads when `work` (about one unit per multiply-add) pays for it.
pub(crate) fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Send + Sync,
) {
    if chunk == 0 {
        return;
    }
    if work >= PARALLEL_WORK && data.len() > chunk {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

/// A per-axis argument list (`stride`, `padding`, ...) as (height, width): two entries,
/// or one shared by both; a 1-d operation (`spatial` 1) takes one entry, its height is
/// `flat` (the geometry of a 2-d operation of height 1).
pub(crate) fn spatial_pair(
    list: &[i64],
    spatial: usize,
    what: &str,
    flat: usize,
) -> KernelResult<[usize; 2]> {
    let v = |i: usize| to_size(list[i], what);
    match (spatial, list.len()) {
        (1, 1) => Ok([flat, v(0)?]),
        (2, 1) => Ok([v(0)?, v(0)?]),
        (2, 2) => Ok([v(0)?, v(1)?]),
        _ => Err(KernelError::invalid(format!(
            "{what} needs {spatial} value(s), got {list:?}"
        ))),
    }
}

/// The outputs `o` in `0..out_len` whose tap `o * stride + offset - pad` falls in
/// `0..in_len`, as a range `lo..hi` (empty when none does).
pub(crate) fn valid_range(
    out_len: usize,
    in_len: usize,
    offset: usize,
    stride: usize,
    pad: usize,
) -> (usize, usize) {
    let lo = pad.saturating_sub(offset).div_ceil(stride);
    let hi = (in_len + pad)
        .saturating_sub(offset)
        .div_ceil(stride)
        .min(out_len);
    (lo.min(hi), hi)
}

/// Registers the convolution, pooling, normalization and softmax kernels.
pub fn register(r: &mut KernelRegistry) {
    conv::register(r);
    pool::register(r);
    norm::register(r);
    activation::register(r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ranges() {
        // 5 outputs, stride 2, pad 1 over 7 inputs: tap 0 reads 2o-1 (valid from o=1 to 3),
        // tap 2 reads 2o+1 (valid for o 0..=2).
        assert_eq!(valid_range(5, 7, 0, 2, 1), (1, 4));
        assert_eq!(valid_range(5, 7, 2, 2, 1), (0, 3));
        assert_eq!(valid_range(3, 2, 10, 1, 0), (0, 0));
        assert_eq!(spatial_pair(&[3], 1, "stride", 1).unwrap(), [1, 3]);
        assert_eq!(spatial_pair(&[3], 2, "stride", 1).unwrap(), [3, 3]);
        assert!(spatial_pair(&[-1, 2], 2, "stride", 1).is_err());
    }
}
