//! Batches of equally shaped products (attention: batch × heads of small matrices).
//!
//! Many small products run one per task, each single-threaded with its thread's
//! scratch, so that dispatch and threading are paid once for the whole batch. When
//! the threads do not divide a batch of large products (three attention heads on two
//! threads), each product is cut into bands of rows so that every thread gets the same
//! share; a single product is split over the threads.

use super::{Epilogue, Gemm, Side, PARALLEL_WORK};
use crate::error::{self, Error, Result};
use crate::mat::{MatMut, MatRef};
use crate::pool::ThreadPool;

/// Elements spanned by a `rows × cols` view with strides `rs`, `cs`.
fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

/// `count` equally shaped strided matrices, matrix i starting at `i * batch_stride`
/// (0 repeats one matrix for the whole batch).
#[derive(Clone, Copy, Debug)]
pub struct BatchRef<'a> {
    data: &'a [f32],
    count: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    bs: usize,
}

impl<'a> BatchRef<'a> {
    /// A batch view, checked against `data`.
    pub fn new(
        data: &'a [f32],
        count: usize,
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
        batch_stride: usize,
    ) -> Result<Self> {
        let last = count.saturating_sub(1).checked_mul(batch_stride);
        let end = last.zip(span(rows, cols, rs, cs)).and_then(|(l, s)| {
            if s == 0 {
                Some(0)
            } else {
                l.checked_add(s)
            }
        });
        match end {
            Some(e) if e <= data.len() || count == 0 => Ok(Self {
                data,
                count,
                rows,
                cols,
                rs,
                cs,
                bs: batch_stride,
            }),
            _ => Err(Error::ViewOutOfBounds {
                rows,
                cols,
                row_stride: rs,
                col_stride: cs,
                len: data.len(),
            }),
        }
    }

    /// Matrix `i`.
    fn get(&self, i: usize) -> Result<MatRef<'a>> {
        let data = self.data.get(i * self.bs..).unwrap_or_default();
        MatRef::new(data, self.rows, self.cols, self.rs, self.cs)
    }
}

/// `count` equally shaped, disjoint writable matrices, matrix i starting at
/// `i * batch_stride`.
#[derive(Debug)]
pub struct BatchMut<'a> {
    data: &'a mut [f32],
    count: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    bs: usize,
}

impl<'a> BatchMut<'a> {
    /// A batch view, checked against `data`; the matrices must not overlap (the batch
    /// stride covers a matrix's span).
    pub fn new(
        data: &'a mut [f32],
        count: usize,
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
        batch_stride: usize,
    ) -> Result<Self> {
        let s = span(rows, cols, rs, cs).ok_or(Error::SizeOverflow {
            what: "batch matrix",
        })?;
        if count > 1 && s > batch_stride {
            return Err(Error::OverlappingOutput {
                rows,
                cols,
                row_stride: rs,
                col_stride: cs,
            });
        }
        let end = count
            .saturating_sub(1)
            .checked_mul(batch_stride)
            .and_then(|l| l.checked_add(s));
        if count > 0 && end.is_none_or(|e| e > data.len()) {
            return Err(Error::ViewOutOfBounds {
                rows,
                cols,
                row_stride: rs,
                col_stride: cs,
                len: data.len(),
            });
        }
        if count > 0 {
            // Each matrix's elements are distinct (the same strides for all).
            MatMut::new(data, rows, cols, rs, cs)?;
        }
        Ok(Self {
            data,
            count,
            rows,
            cols,
            rs,
            cs,
            bs: batch_stride,
        })
    }
}

impl Gemm {
    /// Scratch (f32 elements) for [`Gemm::run_batched`] of `m × n × k` products.
    pub fn batched_scratch_len(
        &self,
        m: usize,
        n: usize,
        k: usize,
        threads: usize,
    ) -> Result<usize> {
        let one = self.scratch_len(m, n, k, false, false, 1)?;
        let whole = self.scratch_len(m, n, k, false, false, threads)?;
        Ok(error::mul(one, threads.max(1), "batched product scratch")?.max(whole))
    }

    /// `C[i] = act(A[i]·B[i] + bias)` for every matrix of the batch.
    pub fn run_batched(
        &self,
        pool: &ThreadPool,
        c: BatchMut<'_>,
        a: BatchRef<'_>,
        b: BatchRef<'_>,
        epilogue: &Epilogue<'_>,
        scratch: &mut [f32],
    ) -> Result {
        let count = c.count;
        if a.count != count
            || b.count != count
            || a.rows != c.rows
            || b.cols != c.cols
            || a.cols != b.rows
        {
            return Err(Error::ShapeMismatch {
                what: format!(
                    "batches of {} {}x{} and {} {}x{} into {} {}x{}",
                    a.count, a.rows, a.cols, b.count, b.rows, b.cols, count, c.rows, c.cols
                ),
            });
        }
        let (m, n, k) = (c.rows, c.cols, a.cols);
        if count == 0 {
            return Ok(());
        }
        let work = m.saturating_mul(n).saturating_mul(k);
        let threads = pool.threads();
        // Bands per product so that every thread gets as many (two each for three
        // products on two threads), when the products are large enough to share.
        let bands = if count > 1
            && threads > 1
            && work >= PARALLEL_WORK
            && !count.is_multiple_of(threads)
        {
            threads / gcd(count, threads)
        } else {
            1
        };
        let band = m.div_ceil(bands).next_multiple_of(self.mr.max(1));
        if bands > 1 && count * bands <= MAX_BANDS && band < m {
            return self.run_bands(pool, c, a, b, epilogue, scratch, band);
        }
        if count == 1 || (work >= PARALLEL_WORK && count < 2 * threads) {
            // One product after the other, each split over the threads.
            for (i, chunk) in c.data.chunks_mut(c.bs.max(1)).enumerate().take(count) {
                let view = MatMut::new(chunk, m, n, c.rs, c.cs)?;
                let (ai, bi) = (a.get(i)?, b.get(i)?.t());
                let (sa, sb) = (Side::Lines(&ai), Side::Lines(&bi));
                self.run_sides(pool, view, sa, sb, epilogue, scratch)?;
            }
            return Ok(());
        }
        let per_thread = self.scratch_len(m, n, k, false, false, 1)?;
        let failed = crate::pool::FirstError::default();
        let (rs, cs) = (c.rs, c.cs);
        pool.parallel_chunks(c.data, c.bs, scratch, per_thread, |i, chunk, part| {
            if i >= count {
                return;
            }
            let mut run = || -> Result {
                let mut view = MatMut::new(chunk, m, n, rs, cs)?;
                let (ai, bi) = (a.get(i)?, b.get(i)?.t());
                let (sa, sb) = (Side::Lines(&ai), Side::Lines(&bi));
                if self.prologue(&mut view, &sa, &sb, epilogue)? {
                    self.block_loop(view, 0, 0, &sa, &sb, epilogue, part)?;
                }
                Ok(())
            };
            failed.keep(run());
        })?;
        failed.into_result()
    }

    /// [`Gemm::run_batched`] with each product cut into bands of `band` rows, one
    /// task per band.
    #[allow(clippy::too_many_arguments)]
    fn run_bands(
        &self,
        pool: &ThreadPool,
        c: BatchMut<'_>,
        a: BatchRef<'_>,
        b: BatchRef<'_>,
        epilogue: &Epilogue<'_>,
        scratch: &mut [f32],
        band: usize,
    ) -> Result {
        let (m, n, k) = (c.rows, c.cols, a.cols);
        let mut tasks: [Option<(usize, usize, MatMut<'_>)>; MAX_BANDS] =
            std::array::from_fn(|_| None);
        let mut slots = tasks.iter_mut();
        let mut filled = 0;
        for (i, chunk) in c.data.chunks_mut(c.bs.max(1)).enumerate().take(c.count) {
            let mut view = MatMut::new(chunk, m, n, c.rs, c.cs)?;
            let (ai, bi) = (a.get(i)?, b.get(i)?.t());
            if !self.prologue(&mut view, &Side::Lines(&ai), &Side::Lines(&bi), epilogue)? {
                continue;
            }
            let (mut rest, mut r0) = (Some(view), 0);
            while let Some(v) = rest.take().filter(|v| v.rows() > 0) {
                let (head, tail) = v.split_at_row(band);
                if let Some(slot) = slots.next() {
                    *slot = Some((i, r0, head));
                    filled += 1;
                }
                r0 += band;
                rest = Some(tail);
            }
        }
        let tasks = tasks.map(std::sync::Mutex::new);
        let per_thread = self.scratch_len(m, n, k, false, false, 1)?;
        let failed = crate::pool::FirstError::default();
        pool.parallel_for_scratch(filled, scratch, per_thread, |t, part| {
            let task = tasks
                .get(t)
                .and_then(|p| p.lock().ok().and_then(|mut g| g.take()));
            let Some((i, r0, view)) = task else {
                return;
            };
            let run = || -> Result {
                let (ai, bi) = (a.get(i)?, b.get(i)?.t());
                let epi = epilogue.at(r0, 0);
                let (sa, sb) = (Side::Lines(&ai), Side::Lines(&bi));
                self.block_loop(view, r0, 0, &sa, &sb, &epi, part)
            };
            failed.keep(run());
        })?;
        failed.into_result()
    }
}

/// Most tasks of a batch cut into bands (they sit in an array on the stack).
const MAX_BANDS: usize = 16;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::tests::values;
    use crate::{Activation, Bias, Isa};

    #[test]
    fn batches_match_single_products() {
        let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
        for isa in Isa::available() {
            let g = Gemm::with_isa(isa).unwrap();
            // (count, m, n, k): many small products, and few larger ones (three and five
            // on two threads are cut into bands of rows).
            for (count, m, n, k) in [
                (8, 17, 13, 9),
                (3, 64, 64, 64),
                (5, 40, 50, 70),
                (1, 5, 3, 2),
                (2, 80, 90, 70),
                (5, 0, 3, 4),
                (4, 3, 5, 0),
            ] {
                let a = values(count * m * k, 1);
                // B given transposed (as K^T in attention), with padding between rows.
                let b = values(count * n * (k + 1), 2);
                let bias = values(n.max(m), 3);
                // A bias per row for odd counts: a band must take its own rows' part.
                let epi = Epilogue {
                    accumulate: false,
                    bias: if count % 2 == 1 {
                        Bias::Row(&bias[..m])
                    } else {
                        Bias::Col(&bias[..n])
                    },
                    activation: Activation::Identity,
                };
                let stride = m * (n + 1);
                let ab = BatchRef::new(&a, count, m, k, k, 1, m * k).unwrap();
                let bb = BatchRef::new(&b, count, k, n, 1, k + 1, n * (k + 1)).unwrap();
                let mut want = vec![0.0; count * stride];
                for i in 0..count {
                    let view = MatMut::new(&mut want[i * stride..], m, n, n + 1, 1).unwrap();
                    let mut s = vec![0.0; g.scratch_len(m, n, k, false, false, 1).unwrap()];
                    let pool = &pools[0];
                    g.run(
                        pool,
                        view,
                        super::super::Lhs::Mat(ab.get(i).unwrap()),
                        super::super::Rhs::Mat(bb.get(i).unwrap()),
                        &epi,
                        &mut s,
                    )
                    .unwrap();
                }
                for pool in &pools {
                    let mut got = vec![0.0; count * stride];
                    let cb = BatchMut::new(&mut got, count, m, n, n + 1, 1, stride).unwrap();
                    let mut s = vec![0.0; g.batched_scratch_len(m, n, k, pool.threads()).unwrap()];
                    g.run_batched(pool, cb, ab, bb, &epi, &mut s).unwrap();
                    for (x, y) in got.iter().zip(&want) {
                        assert!(
                            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                            "{isa:?} {count}x{m}x{n}x{k}: {x} vs {y}"
                        );
                    }
                }
            }
        }
        let mut c = vec![0.0; 10];
        assert!(BatchMut::new(&mut c, 2, 2, 2, 2, 1, 3).is_err());
        assert!(BatchMut::new(&mut c, 3, 2, 2, 2, 1, 4).is_err());
        assert!(BatchRef::new(&c, 3, 2, 2, 2, 1, 4).is_err());
        assert!(BatchRef::new(&c, 5, 2, 2, 2, 1, 0).is_ok());
    }
}
