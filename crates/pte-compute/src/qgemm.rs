//! Integer matrix products for quantized layers: `acc[n][m] = Σ_k a[m][k] · w[n][k]`
//! over int8 operands with int32 accumulators, the core of XNNPACK-style quantized
//! fully connected and convolution layers (static qs8/qu8, and dynamically quantized
//! activations with 8-bit or 4-bit weights).
//!
//! Weights are kept as rows of int8 ([`PackedI8`], 4-bit weights unpacked to their
//! centered values once at load) with their row sums, so that zero points fold into
//! the caller's epilogue: `Σ (a - za)(w - zw) = acc - za·Σw - zw·Σa + k·za·zw`.
//! Blockwise weights ([`PackedI8::with_blocks`]) accumulate each block of the depth
//! separately, for per-block scales.
//!
//! Four weight rows share each load of an activation row; the products are widened to
//! 16 bits and summed pairwise into 32-bit lanes, a loop LLVM vectorizes per
//! instruction set (`vpmaddwd` on AVX2). Accumulators are written transposed
//! (`[n][m]`), so that threads split the output channels into contiguous parts.

use crate::arch::{multiversion, Isa};
use crate::error::{self, Error, Result};
use crate::pool::ThreadPool;

/// Weight rows (output channels) of int8, with their sums.
#[derive(Clone, Debug)]
pub struct PackedI8 {
    n: usize,
    k: usize,
    /// Depth of a block (`k` when not blockwise).
    block: usize,
    w: Vec<i8>,
    sums: Vec<i32>,
}

impl PackedI8 {
    /// Rows `w` of `n × k` int8 values.
    pub fn new(w: &[i8], n: usize, k: usize) -> Result<Self> {
        Self::with_blocks(w, n, k, k.max(1))
    }

    /// Rows whose depth is split in blocks of `block` (for per-block scales); the sums
    /// are then per block, `[n][k / block]`.
    pub fn with_blocks(w: &[i8], n: usize, k: usize, block: usize) -> Result<Self> {
        let len = error::mul(n, k, "quantized weights")?;
        error::need("quantized weights", w.len(), len)?;
        if block == 0 || !k.is_multiple_of(block) {
            return Err(Error::InvalidParameter {
                what: format!("block {block} does not divide depth {k}"),
            });
        }
        let w = w.get(..len).unwrap_or_default().to_vec();
        let sums = if k == 0 {
            vec![0; n]
        } else {
            w.chunks_exact(block)
                .map(|b| b.iter().map(|&v| i32::from(v)).sum())
                .collect()
        };
        Ok(Self {
            n,
            k,
            block,
            w,
            sums,
        })
    }

    /// Output channels.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Depth.
    pub fn depth(&self) -> usize {
        self.k
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        if self.k == 0 {
            1
        } else {
            self.k / self.block
        }
    }

    /// Sum of each row's weights per block (`[n][blocks]`).
    pub fn sums(&self) -> &[i32] {
        &self.sums
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        self.w.len() + self.sums.len() * 4
    }
}

/// `acc += x · w` lane by lane, widened to 32 bits.
#[inline(always)]
fn mac(acc: &mut [i32; 16], x: &[i8; 16], w: &[i8; 16]) {
    for ((a, &x), &w) in acc.iter_mut().zip(x).zip(w) {
        *a += i32::from(x) * i32::from(w);
    }
}

fn block16(s: &[i8], c: usize) -> Option<&[i8; 16]> {
    s.get(c * 16..c * 16 + 16)
        .and_then(|b| <&[i8; 16]>::try_from(b).ok())
}

multiversion! {
    /// Dot products of `a` with four rows at once.
    fn dot4<const FMA: bool>(a: &[i8], w0: &[i8], w1: &[i8], w2: &[i8], w3: &[i8]) -> [i32; 4] {
        let (mut s0, mut s1, mut s2, mut s3) = ([0i32; 16], [0i32; 16], [0i32; 16], [0i32; 16]);
        let chunks = a.len() / 16;
        for c in 0..chunks {
            let (Some(x), Some(p), Some(q), Some(r), Some(t)) =
                (block16(a, c), block16(w0, c), block16(w1, c), block16(w2, c), block16(w3, c))
            else {
                break;
            };
            mac(&mut s0, x, p);
            mac(&mut s1, x, q);
            mac(&mut s2, x, r);
            mac(&mut s3, x, t);
        }
        let mut out = [s0, s1, s2, s3].map(|v| v.iter().sum::<i32>());
        for i in chunks * 16..a.len() {
            let x = i32::from(a.get(i).copied().unwrap_or(0));
            for (o, w) in out.iter_mut().zip([w0, w1, w2, w3]) {
                *o += x * i32::from(w.get(i).copied().unwrap_or(0));
            }
        }
        out
    }
}

multiversion! {
    /// One dot product.
    fn dot1<const FMA: bool>(a: &[i8], w: &[i8]) -> i32 {
        let mut acc = [0i32; 16];
        let chunks = a.len() / 16;
        for c in 0..chunks {
            let (Some(x), Some(p)) = (block16(a, c), block16(w, c)) else { break };
            mac(&mut acc, x, p);
        }
        let mut out: i32 = acc.iter().sum();
        for i in chunks * 16..a.len() {
            out += i32::from(a.get(i).copied().unwrap_or(0)) * i32::from(w.get(i).copied().unwrap_or(0));
        }
        out
    }
}

/// Rows of the activations: `m` rows of `k` values, `stride` apart.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub data: &'a [i8],
    pub m: usize,
    pub stride: usize,
}

impl<'a> Rows<'a> {
    fn row(&self, i: usize, k: usize) -> &'a [i8] {
        self.data
            .get(i * self.stride..i * self.stride + k)
            .unwrap_or_default()
    }
}

/// `acc[n][m][b] = Σ_{k in block b} a[m][k] · w[n][k]` for every output channel `n`,
/// row `m` and block `b` (one block when the weights are not blockwise), split over
/// the pool's threads by output channels. `acc` holds at least `n · m · blocks` values.
pub fn qgemm(isa: Isa, pool: &ThreadPool, a: Rows<'_>, w: &PackedI8, acc: &mut [i32]) -> Result {
    let (n, k, m) = (w.n, w.k, a.m);
    let blocks = w.blocks();
    let per_n = error::mul(m, blocks, "accumulators")?;
    let need = error::mul(n, per_n, "accumulators")?;
    error::need("accumulators", acc.len(), need)?;
    if m > 0 && (a.stride < k || a.data.len() < (m - 1) * a.stride + k) {
        return Err(Error::BufferTooSmall {
            what: "quantized activations",
            len: a.data.len(),
            needed: (m - 1) * a.stride + k,
        });
    }
    let acc = acc.get_mut(..need).unwrap_or_default();
    if need == 0 {
        return Ok(());
    }
    if k == 0 {
        acc.fill(0);
        return Ok(());
    }
    let bl = w.block;
    // Groups of 4 channels per chunk.
    let chunk = 4 * per_n;
    pool.parallel_chunks(acc, chunk, &mut [0u8; 0], 0, |ci, out, _| {
        let n0 = ci * 4;
        let rows = out.len() / per_n;
        let wrow = |j: usize| w.w.get((n0 + j) * k..(n0 + j + 1) * k).unwrap_or_default();
        for i in 0..m {
            let x = a.row(i, k);
            for b in 0..blocks {
                let r = b * bl..(b + 1) * bl;
                let xb = x.get(r.clone()).unwrap_or_default();
                if rows == 4 {
                    let (w0, w1, w2, w3) = (wrow(0), wrow(1), wrow(2), wrow(3));
                    let d = dot4(
                        isa,
                        xb,
                        w0.get(r.clone()).unwrap_or_default(),
                        w1.get(r.clone()).unwrap_or_default(),
                        w2.get(r.clone()).unwrap_or_default(),
                        w3.get(r.clone()).unwrap_or_default(),
                    );
                    for (j, v) in d.iter().enumerate() {
                        if let Some(o) = out.get_mut(j * per_n + i * blocks + b) {
                            *o = *v;
                        }
                    }
                } else {
                    for j in 0..rows {
                        let d = dot1(isa, xb, wrow(j).get(r.clone()).unwrap_or_default());
                        if let Some(o) = out.get_mut(j * per_n + i * blocks + b) {
                            *o = d;
                        }
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_a_direct_loop() {
        let pool = ThreadPool::new(2).unwrap();
        for (m, n, k, block) in [
            (1, 7, 33, 33),
            (5, 9, 64, 32),
            (3, 4, 17, 17),
            (2, 10, 96, 32),
            (0, 3, 4, 4),
        ] {
            let a: Vec<i8> = (0..m * (k + 3))
                .map(|i| ((i * 37 + 11) % 256) as u8 as i8)
                .collect();
            let wv: Vec<i8> = (0..n * k)
                .map(|i| ((i * 53 + 7) % 256) as u8 as i8)
                .collect();
            let w = PackedI8::with_blocks(&wv, n, k, block).unwrap();
            let blocks = k / block;
            for isa in Isa::available() {
                let mut acc = vec![0; n * m * blocks];
                qgemm(
                    isa,
                    &pool,
                    Rows {
                        data: &a,
                        m,
                        stride: k + 3,
                    },
                    &w,
                    &mut acc,
                )
                .unwrap();
                for j in 0..n {
                    for i in 0..m {
                        for b in 0..blocks {
                            let want: i32 = (b * block..(b + 1) * block)
                                .map(|p| i32::from(a[i * (k + 3) + p]) * i32::from(wv[j * k + p]))
                                .sum();
                            assert_eq!(
                                acc[(j * m + i) * blocks + b],
                                want,
                                "{isa:?} m{m} n{n} k{k}"
                            );
                        }
                    }
                    for b in 0..blocks {
                        let s: i32 = wv[j * k + b * block..j * k + (b + 1) * block]
                            .iter()
                            .map(|&v| i32::from(v))
                            .sum();
                        assert_eq!(w.sums()[j * blocks + b], s);
                    }
                }
            }
        }
        let w = PackedI8::new(&[1; 8], 2, 4).unwrap();
        assert!(qgemm(
            Isa::Generic,
            &pool,
            Rows {
                data: &[0; 3],
                m: 1,
                stride: 4
            },
            &w,
            &mut [0; 2]
        )
        .is_err());
        assert!(PackedI8::with_blocks(&[1; 8], 2, 4, 3).is_err());
    }
}
