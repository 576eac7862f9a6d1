//! Binary f32 operations over operands broadcast NumPy-style, followed by a clamp.
//!
//! The output is walked in runs along its innermost dimension; each run is one of
//! three vectorized loops (both operands contiguous, left or right operand constant
//! along the run), compiled once per instruction set. Broadcast dimensions of size 1
//! are folded away first, and adjacent dimensions that are contiguous in all three
//! tensors are merged, so that most calls are one long run.

use crate::arch::{multiversion, Isa};
use crate::elementwise::{clamp, per_binary_op, BinaryOp};
use crate::error::{Error, Result};

/// Most dimensions an operand may have.
pub const MAX_DIMS: usize = 8;

multiversion! {
    fn run_vv<const FMA: bool>(op: BinaryOp, out: &mut [f32], x: &[f32], y: &[f32], min: f32, max: f32) {
        macro_rules! body {
            ($f:expr) => {{
                let f = $f;
                for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
                    *o = clamp(f(a, b), min, max);
                }
            }};
        }
        per_binary_op!(op, body)
    }
}

multiversion! {
    fn run_vs<const FMA: bool>(op: BinaryOp, out: &mut [f32], x: &[f32], y: f32, min: f32, max: f32) {
        macro_rules! body {
            ($f:expr) => {{
                let f = $f;
                for (o, &a) in out.iter_mut().zip(x) {
                    *o = clamp(f(a, y), min, max);
                }
            }};
        }
        per_binary_op!(op, body)
    }
}

multiversion! {
    fn run_sv<const FMA: bool>(op: BinaryOp, out: &mut [f32], x: f32, y: &[f32], min: f32, max: f32) {
        macro_rules! body {
            ($f:expr) => {{
                let f = $f;
                for (o, &b) in out.iter_mut().zip(y) {
                    *o = clamp(f(x, b), min, max);
                }
            }};
        }
        per_binary_op!(op, body)
    }
}

multiversion! {
    /// `op(x, y)` where one operand is a whole matrix (as long as `out`) and the other
    /// one row of it, repeated: `y` is the row when `row_is_y`, else `x`.
    fn run_rows<const FMA: bool>(op: BinaryOp, out: &mut [f32], x: &[f32], y: &[f32], row_is_y: bool, min: f32, max: f32) {
        macro_rules! body {
            ($f:expr) => {{
                let f = $f;
                let (whole, row) = if row_is_y { (x, y) } else { (y, x) };
                let n = row.len().max(1);
                for (o, w) in out.chunks_exact_mut(n).zip(whole.chunks_exact(n)) {
                    if row_is_y {
                        for ((o, &a), &b) in o.iter_mut().zip(w).zip(row) {
                            *o = clamp(f(a, b), min, max);
                        }
                    } else {
                        for ((o, &a), &b) in o.iter_mut().zip(row).zip(w) {
                            *o = clamp(f(a, b), min, max);
                        }
                    }
                }
            }};
        }
        per_binary_op!(op, body)
    }
}

/// `out = clamp(op(x, y), min, max)` for operands of the same length.
pub fn same(
    isa: Isa,
    op: BinaryOp,
    out: &mut [f32],
    x: &[f32],
    y: &[f32],
    min: f32,
    max: f32,
) -> Result {
    if x.len() != out.len() || y.len() != out.len() {
        return Err(Error::ShapeMismatch {
            what: format!(
                "operands of {} and {} elements into {}",
                x.len(),
                y.len(),
                out.len()
            ),
        });
    }
    run_vv(isa, op, out, x, y, min, max);
    Ok(())
}

/// Shapes of a broadcast binary operation, simplified: right-aligned, size-1
/// dimensions dropped, contiguous neighbours merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broadcast {
    /// Output dimensions, outermost first.
    dims: Vec<usize>,
    /// Element strides of x and y per output dimension (0 where broadcast).
    x_strides: Vec<usize>,
    y_strides: Vec<usize>,
    numel: usize,
    x_len: usize,
    y_len: usize,
}

impl Broadcast {
    /// Plans `op(x, y)` for operands of these shapes; errors if they do not broadcast.
    pub fn new(x: &[usize], y: &[usize]) -> Result<Broadcast> {
        let rank = x.len().max(y.len());
        if rank > MAX_DIMS {
            return Err(Error::InvalidParameter {
                what: format!("broadcast of rank {rank} (at most {MAX_DIMS})"),
            });
        }
        let at = |s: &[usize], i: usize| -> usize {
            (i + s.len())
                .checked_sub(rank)
                .and_then(|j| s.get(j))
                .copied()
                .unwrap_or(1)
        };
        // (out, x, y) sizes per dimension, size-1 output dimensions dropped.
        let mut dims: Vec<(usize, bool, bool)> = Vec::new();
        let (mut numel, mut x_len, mut y_len) = (1usize, 1usize, 1usize);
        for i in 0..rank {
            let (a, b) = (at(x, i), at(y, i));
            let o = if a == b || b == 1 {
                a
            } else if a == 1 {
                b
            } else {
                return Err(Error::ShapeMismatch {
                    what: format!("shapes {x:?} and {y:?} do not broadcast"),
                });
            };
            let of = |v: usize, acc: usize| {
                acc.checked_mul(v)
                    .ok_or(Error::SizeOverflow { what: "broadcast" })
            };
            numel = of(o, numel)?;
            x_len = of(a, x_len)?;
            y_len = of(b, y_len)?;
            if o != 1 {
                dims.push((o, a != 1, b != 1));
            }
        }
        // Merge neighbours broadcast the same way (their elements are contiguous).
        let mut merged: Vec<(usize, bool, bool)> = Vec::new();
        for d in dims {
            match merged.last_mut() {
                Some(last) if last.1 == d.1 && last.2 == d.2 => last.0 *= d.0,
                _ => merged.push(d),
            }
        }
        let mut x_strides = vec![0; merged.len()];
        let mut y_strides = vec![0; merged.len()];
        let (mut xs, mut ys) = (1usize, 1usize);
        for (k, &(o, xa, ya)) in merged.iter().enumerate().rev() {
            if xa {
                if let Some(s) = x_strides.get_mut(k) {
                    *s = xs;
                }
                xs *= o;
            }
            if ya {
                if let Some(s) = y_strides.get_mut(k) {
                    *s = ys;
                }
                ys *= o;
            }
        }
        Ok(Broadcast {
            dims: merged.iter().map(|d| d.0).collect(),
            x_strides,
            y_strides,
            numel,
            x_len,
            y_len,
        })
    }

    /// Elements of the output.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Elements of the output's innermost run: where a caller may cut the output to
    /// split it between threads ([`Broadcast::run_part`]).
    pub fn run_len(&self) -> usize {
        self.dims.last().copied().unwrap_or(1)
    }

    /// `out = clamp(op(x, y), min, max)` over the broadcast shapes (lengths checked).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        isa: Isa,
        op: BinaryOp,
        out: &mut [f32],
        x: &[f32],
        y: &[f32],
        min: f32,
        max: f32,
    ) -> Result {
        if out.len() < self.numel {
            return Err(Error::ShapeMismatch {
                what: format!(
                    "broadcast into {} elements got an output of {}",
                    self.numel,
                    out.len()
                ),
            });
        }
        let out = out.get_mut(..self.numel).unwrap_or_default();
        self.run_part(isa, op, 0, out, x, y, min, max)
    }

    /// [`Broadcast::run`] for the output elements `start..start + out.len()` alone:
    /// `start` and the length are multiples of [`Broadcast::run_len`].
    #[allow(clippy::too_many_arguments)]
    pub fn run_part(
        &self,
        isa: Isa,
        op: BinaryOp,
        start: usize,
        out: &mut [f32],
        x: &[f32],
        y: &[f32],
        min: f32,
        max: f32,
    ) -> Result {
        let inner = self.run_len();
        let end = start.checked_add(out.len());
        if x.len() < self.x_len
            || y.len() < self.y_len
            || end.is_none_or(|e| e > self.numel)
            || !start.is_multiple_of(inner)
            || !out.len().is_multiple_of(inner)
        {
            return Err(Error::ShapeMismatch {
                what: format!(
                    "broadcast of {} and {} elements into {} got {}, {} and {} at {start}",
                    self.x_len,
                    self.y_len,
                    self.numel,
                    x.len(),
                    y.len(),
                    out.len()
                ),
            });
        }
        if out.is_empty() {
            return Ok(());
        }
        let Some((&inner, outer)) = self.dims.split_last() else {
            // Every dimension is 1: one element.
            if let (Some(o), Some(&a), Some(&b)) = (out.first_mut(), x.first(), y.first()) {
                *o = clamp(op.apply_scalar(a, b), min, max);
            }
            return Ok(());
        };
        let (xi, yi) = (
            self.x_strides.last().copied().unwrap_or(0),
            self.y_strides.last().copied().unwrap_or(0),
        );
        // A matrix and one of its rows (a per-channel scale of NHWC pixels): one call
        // for all rows; per row, the call cost more than a row of 16 channels.
        let outer_strides = (self.x_strides.first(), self.y_strides.first());
        if let ([_], (Some(&xo), Some(&yo)), (1, 1)) = (outer, outer_strides, (xi, yi)) {
            let whole = start..start + out.len();
            let rows = match (xo, yo) {
                (o, 0) if o == inner => x.get(whole).zip(y.get(..inner)).map(|(a, b)| (a, b, true)),
                (0, o) if o == inner => {
                    x.get(..inner).zip(y.get(whole)).map(|(a, b)| (a, b, false))
                }
                _ => None,
            };
            if let Some((a, b, row_is_y)) = rows {
                run_rows(isa, op, out, a, b, row_is_y, min, max);
                return Ok(());
            }
        }
        // The outer index, on the stack (the rank is at most `MAX_DIMS`): a call
        // allocates nothing.
        let mut index = [0usize; MAX_DIMS];
        let mut first = start / inner;
        for k in (0..outer.len()).rev() {
            if let (Some(i), Some(&d)) = (index.get_mut(k), outer.get(k)) {
                *i = first % d.max(1);
                first /= d.max(1);
            }
        }
        for run in out.chunks_exact_mut(inner) {
            let (xo, yo) = index.iter().enumerate().fold((0, 0), |(a, b), (k, &i)| {
                (
                    a + i * self.x_strides.get(k).copied().unwrap_or(0),
                    b + i * self.y_strides.get(k).copied().unwrap_or(0),
                )
            });
            match (xi, yi) {
                (1, 1) => run_vv(
                    isa,
                    op,
                    run,
                    x.get(xo..xo + inner).unwrap_or_default(),
                    y.get(yo..yo + inner).unwrap_or_default(),
                    min,
                    max,
                ),
                (1, _) => run_vs(
                    isa,
                    op,
                    run,
                    x.get(xo..xo + inner).unwrap_or_default(),
                    y.get(yo).copied().unwrap_or(0.0),
                    min,
                    max,
                ),
                _ => run_sv(
                    isa,
                    op,
                    run,
                    x.get(xo).copied().unwrap_or(0.0),
                    y.get(yo..yo + inner).unwrap_or_default(),
                    min,
                    max,
                ),
            }
            // Next outer index.
            for k in (0..outer.len()).rev() {
                if let (Some(i), Some(&d)) = (index.get_mut(k), outer.get(k)) {
                    *i += 1;
                    if *i < d {
                        break;
                    }
                    *i = 0;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(
        x: &[f32],
        xs: &[usize],
        y: &[f32],
        ys: &[usize],
        op: BinaryOp,
    ) -> (Vec<usize>, Vec<f32>) {
        let rank = xs.len().max(ys.len());
        let pad = |s: &[usize]| {
            let mut v = vec![1; rank - s.len()];
            v.extend_from_slice(s);
            v
        };
        let (xs, ys) = (pad(xs), pad(ys));
        let out: Vec<usize> = xs.iter().zip(&ys).map(|(&a, &b)| a.max(b)).collect();
        let n: usize = out.iter().product();
        let mut res = Vec::with_capacity(n);
        for flat in 0..n {
            let mut rem = flat;
            let mut idx = vec![0; rank];
            for k in (0..rank).rev() {
                idx[k] = rem % out[k];
                rem /= out[k];
            }
            let off = |s: &[usize]| {
                let mut o = 0;
                for k in 0..rank {
                    o = o * s[k] + if s[k] == 1 { 0 } else { idx[k] };
                }
                o
            };
            res.push(op.apply_scalar(x[off(&xs)], y[off(&ys)]));
        }
        (out, res)
    }

    #[test]
    fn broadcasts_match_the_reference() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3, 4], &[2, 3, 4]),
            (&[2, 3, 4], &[4]),
            (&[2, 3, 4], &[3, 1]),
            (&[1, 3, 1], &[2, 1, 4]),
            (&[4], &[2, 3, 4]),
            (&[], &[5]),
            (&[2, 1, 4, 1], &[1, 3, 1, 5]),
            (&[1], &[1]),
        ];
        for isa in Isa::available() {
            for &(xs, ys) in cases {
                for op in [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Div,
                    BinaryOp::Max,
                    BinaryOp::Prelu,
                ] {
                    let x: Vec<f32> = (0..xs.iter().product::<usize>())
                        .map(|i| i as f32 - 3.5)
                        .collect();
                    let y: Vec<f32> = (0..ys.iter().product::<usize>())
                        .map(|i| i as f32 * 0.5 + 0.25)
                        .collect();
                    let (_, want) = reference(&x, xs, &y, ys, op);
                    let b = Broadcast::new(xs, ys).unwrap();
                    let mut out = vec![0.0; b.numel()];
                    b.run(isa, op, &mut out, &x, &y, -100.0, 100.0).unwrap();
                    let want: Vec<f32> = want.iter().map(|v| v.clamp(-100.0, 100.0)).collect();
                    assert_eq!(out, want, "{isa:?} {op:?} {xs:?} {ys:?}");
                }
            }
        }
        // Parts of whole runs, as threads would split the output, give the same; a
        // matrix and its row (either side) are taken in one call per part.
        for isa in Isa::available() {
            for (xs, ys) in [(&[6usize, 8][..], &[8usize][..]), (&[8], &[6, 8])] {
                let x: Vec<f32> = (0..xs.iter().product()).map(|i| i as f32 - 20.0).collect();
                let y: Vec<f32> = (0..ys.iter().product())
                    .map(|i| i as f32 * 0.5 + 1.0)
                    .collect();
                let (_, want) = reference(&x, xs, &y, ys, BinaryOp::Div);
                let b = Broadcast::new(xs, ys).unwrap();
                let mut parts = vec![0.0; 48];
                for (k, part) in parts.chunks_mut(16).enumerate() {
                    b.run_part(isa, BinaryOp::Div, k * 16, part, &x, &y, -100.0, 100.0)
                        .unwrap();
                }
                assert_eq!(parts, want, "{isa:?} {xs:?} {ys:?}");
            }
        }
        for isa in Isa::available() {
            let (xs, ys) = ([3usize, 4, 5], [4usize, 1]);
            let x: Vec<f32> = (0..60).map(|i| i as f32 * 0.25 - 3.0).collect();
            let y = [1.5f32, -2.0, 0.5, 3.0];
            let b = Broadcast::new(&xs, &ys).unwrap();
            let mut whole = vec![0.0; 60];
            b.run(isa, BinaryOp::Mul, &mut whole, &x, &y, -100.0, 100.0)
                .unwrap();
            let run = b.run_len();
            assert_eq!(run, 5);
            let mut parts = vec![0.0; 60];
            for (k, part) in parts.chunks_mut(3 * run).enumerate() {
                b.run_part(isa, BinaryOp::Mul, k * 3 * run, part, &x, &y, -100.0, 100.0)
                    .unwrap();
            }
            assert_eq!(parts, whole, "{isa:?}");
            let mut short = vec![0.0; run + 1];
            assert!(b
                .run_part(isa, BinaryOp::Mul, 0, &mut short, &x, &y, 0.0, 1.0)
                .is_err());
            assert!(b
                .run_part(isa, BinaryOp::Mul, 1, &mut short[..run], &x, &y, 0.0, 1.0)
                .is_err());
            assert!(b
                .run_part(isa, BinaryOp::Mul, 60, &mut short[..run], &x, &y, 0.0, 1.0)
                .is_err());
        }
        assert!(Broadcast::new(&[2, 3], &[4]).is_err());
        let b = Broadcast::new(&[2, 3], &[3]).unwrap();
        assert!(b
            .run(
                Isa::Generic,
                BinaryOp::Add,
                &mut [0.0; 6],
                &[0.0; 5],
                &[0.0; 3],
                0.0,
                1.0
            )
            .is_err());
    }
}
