//! Conversions between the NCHW layout of programs and the NHWC (channels last) layout
//! that a chain of [`crate::Conv2dNhwc`] layers keeps between its ends.

use crate::arch::{multiversion, Isa};
use crate::error::{self, Error, Result};

/// Channels moved at once: one cache line of the NHWC side.
const BLOCK: usize = 16;

fn check(x: usize, y: usize, batch: usize, channels: usize, pixels: usize) -> Result<usize> {
    let image = error::mul(channels, pixels, "image")?;
    let len = error::mul(image, batch, "images")?;
    if x != len || y != len {
        return Err(Error::ShapeMismatch {
            what: format!(
                "{x} and {y} values for {batch} images of {channels} channels × {pixels} pixels"
            ),
        });
    }
    Ok(image)
}

multiversion! {
    fn to_nhwc<const FMA: bool>(x: &[f32], channels: usize, pixels: usize, y: &mut [f32]) {
        let mut c0 = 0;
        while c0 < channels {
            let cb = BLOCK.min(channels - c0);
            let planes: [&[f32]; BLOCK] = std::array::from_fn(|i| {
                if i < cb {
                    x.get((c0 + i) * pixels..(c0 + i + 1) * pixels).unwrap_or_default()
                } else {
                    &[]
                }
            });
            for (p, px) in y.chunks_exact_mut(channels).enumerate() {
                for (o, plane) in px.iter_mut().skip(c0).take(cb).zip(&planes) {
                    *o = plane.get(p).copied().unwrap_or(0.0);
                }
            }
            c0 += cb;
        }
    }
}

multiversion! {
    fn to_nchw<const FMA: bool>(x: &[f32], channels: usize, pixels: usize, y: &mut [f32]) {
        let mut c0 = 0;
        while c0 < channels {
            let cb = BLOCK.min(channels - c0);
            for (i, plane) in y.chunks_exact_mut(pixels).skip(c0).take(cb).enumerate() {
                for (o, px) in plane.iter_mut().zip(x.chunks_exact(channels)) {
                    *o = px.get(c0 + i).copied().unwrap_or(0.0);
                }
            }
            c0 += cb;
        }
    }
}

/// `y[n][p][c] = x[n][c][p]` for `batch` images of `channels × pixels`.
pub fn nchw_to_nhwc(
    isa: Isa,
    x: &[f32],
    batch: usize,
    channels: usize,
    pixels: usize,
    y: &mut [f32],
) -> Result {
    let image = check(x.len(), y.len(), batch, channels, pixels)?;
    if image == 0 {
        return Ok(());
    }
    for (xi, yi) in x.chunks_exact(image).zip(y.chunks_exact_mut(image)) {
        to_nhwc(isa, xi, channels, pixels, yi);
    }
    Ok(())
}

/// `y[n][c][p] = x[n][p][c]` for `batch` images of `pixels × channels`.
pub fn nhwc_to_nchw(
    isa: Isa,
    x: &[f32],
    batch: usize,
    channels: usize,
    pixels: usize,
    y: &mut [f32],
) -> Result {
    let image = check(x.len(), y.len(), batch, channels, pixels)?;
    if image == 0 {
        return Ok(());
    }
    for (xi, yi) in x.chunks_exact(image).zip(y.chunks_exact_mut(image)) {
        to_nchw(isa, xi, channels, pixels, yi);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_are_inverse_transposes() {
        for isa in Isa::available() {
            for (batch, c, p) in [(1, 3, 50176), (2, 17, 9), (1, 40, 1), (3, 1, 5)] {
                let x: Vec<f32> = (0..batch * c * p).map(|i| i as f32).collect();
                let mut y = vec![0.0; x.len()];
                nchw_to_nhwc(isa, &x, batch, c, p, &mut y).unwrap();
                for n in 0..batch {
                    for ch in 0..c {
                        for px in 0..p {
                            assert_eq!(y[n * c * p + px * c + ch], x[n * c * p + ch * p + px]);
                        }
                    }
                }
                let mut back = vec![0.0; x.len()];
                nhwc_to_nchw(isa, &y, batch, c, p, &mut back).unwrap();
                assert_eq!(back, x);
            }
        }
        assert!(nchw_to_nhwc(Isa::Generic, &[0.0; 5], 1, 2, 3, &mut [0.0; 6]).is_err());
    }
}
