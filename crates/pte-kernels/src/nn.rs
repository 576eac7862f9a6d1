//! Neural-network kernels: convolution ([`conv`]), pooling ([`pool`]), normalization
//! ([`norm`]), softmax-like activations ([`activation`]) and resampling ([`sample`]).
//!
//! Each computes in PyTorch's "opmath" type (`Elem::Acc`: float32 for float16 and
//! bfloat16, else the element type itself) and takes inputs of any dim order.

use pte_runtime::{KernelError, KernelRegistry, KernelResult};

use crate::util::to_size;

mod activation;
mod conv;
mod norm;
mod pool;
pub(crate) mod sample;

/// A per-axis argument list (`stride`, `padding`, ...) as (height, width): two entries,
/// or one shared by both; a 1-d operation (`spatial` 1) takes one entry, its height is
/// `flat` (the geometry of a 2-d operation of height 1).
fn spatial_pair(list: &[i64], spatial: usize, what: &str, flat: usize) -> KernelResult<[usize; 2]> {
    match (spatial, list) {
        (1, &[v]) => Ok([flat, to_size(v, what)?]),
        (2, &[v]) => Ok([to_size(v, what)?; 2]),
        (2, &[a, b]) => Ok([to_size(a, what)?, to_size(b, what)?]),
        _ => Err(KernelError::invalid(format!(
            "{what} needs {spatial} value(s), got {list:?}"
        ))),
    }
}

/// Registers the convolution, pooling, normalization and softmax kernels.
pub fn register(r: &mut KernelRegistry) {
    conv::register(r);
    pool::register(r);
    norm::register(r);
    activation::register(r);
    sample::register(r);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spatial_pairs() {
        assert_eq!(spatial_pair(&[3], 1, "stride", 1).unwrap(), [1, 3]);
        assert_eq!(spatial_pair(&[3], 2, "stride", 1).unwrap(), [3, 3]);
        assert!(spatial_pair(&[-1, 2], 2, "stride", 1).is_err());
    }
}
