//! Softmax over the last dimension, and scaled dot-product attention.

use pte_compute::{Epilogue, Gemm, Isa, Lhs, MatMut, MatRef, Rhs};

use super::quant::{self, Q8};
use super::{
    arg, bytes, bytes_mut, describe, f32s, f32s_mut, family, numel, set_shape, shape_of, Family,
    KResult, Kernel, NodeCx, PResult, Prepared,
};
use crate::exec::{Cx, In, Out};
use crate::graph::Dims;

struct Softmax {
    isa: Isa,
    /// Length of the last dimension for the current shape.
    row: usize,
    /// 8-bit: (signed, input scale, input zero point, output scale, output zero point).
    quant: Option<(bool, f32, i32, f32, i32)>,
}

impl Kernel for Softmax {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let s = shape_of(inputs, 0)?;
        if s.is_empty() {
            return Err("softmax of a scalar".into());
        }
        self.row = s.last().copied().unwrap_or(1);
        set_shape(outputs, 0, s)
    }

    fn scratch_bytes(&self, _threads: usize) -> usize {
        // 8-bit rows are dequantized into scratch.
        self.quant.map_or(0, |_| self.row * 8)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let n = numel(x.dims);
        let row = x.dims.last().copied().unwrap_or(1);
        let out = outputs.first_mut().ok_or("no output")?;
        match self.quant {
            None => {
                let src = f32s(x.bytes, n)?;
                let dst = f32s_mut(out.bytes, n)?;
                if row == 0 {
                    return Ok(());
                }
                let rows_per = (1 << 14) / row.max(1) + 1;
                super::elementwise::split_rows(cx, dst, row, rows_per, |start, d| {
                    let s = src.get(start..start + d.len()).unwrap_or_default();
                    let _ = pte_compute::elementwise::softmax_rows(self.isa, d, s, row);
                })
            }
            Some((signed, si, zi, so, zo)) => {
                let get = |v: u8| {
                    if signed {
                        i32::from(v as i8)
                    } else {
                        i32::from(v)
                    }
                };
                let src = bytes(x.bytes, n)?;
                let dst = bytes_mut(out.bytes, n)?;
                let (buf, y) = cx
                    .scratch
                    .slice_mut::<f32>(2 * row)
                    .map_err(|e| e.to_string())?
                    .split_at_mut(row);
                for (s, d) in src
                    .chunks_exact(row.max(1))
                    .zip(dst.chunks_exact_mut(row.max(1)))
                {
                    for (b, &v) in buf.iter_mut().zip(s) {
                        *b = si * (get(v) - zi) as f32;
                    }
                    let _ = pte_compute::elementwise::softmax_rows(self.isa, y, buf, row);
                    for (o, &p) in d.iter_mut().zip(y.iter()) {
                        let q = quant::rint(p / so) + zo;
                        *o = if signed {
                            i8::from_i32(q) as u8
                        } else {
                            u8::from_i32(q)
                        };
                    }
                }
                Ok(())
            }
        }
    }
}

/// Softmax over the last dimension.
pub(crate) fn softmax(cx: &NodeCx<'_>) -> PResult<Prepared> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    let quant = match (family(x), family(y)) {
        (Family::Float, Family::Float) => None,
        (a @ (Family::QInt8 | Family::QUInt8), b) if a == b => {
            let ((si, zi), (so, zo)) = x
                .per_tensor()
                .zip(y.per_tensor())
                .ok_or("8-bit softmax needs per-tensor parameters")?;
            Some((a == Family::QInt8, si, zi, so, zo))
        }
        _ => {
            return Err(format!(
                "softmax {} -> {} is not supported",
                describe(x),
                describe(y)
            )
            .into())
        }
    };
    Prepared::new(Softmax {
        isa: Isa::best(),
        row: 0,
        quant,
    })
}

struct Sdpa {
    gemm: Gemm,
    isa: Isa,
    /// Batch dims of the output (query's), and of key/value padded to them.
    batch: Dims,
    kv_batch: Dims,
    t: usize,
    u: usize,
    c: usize,
    d: usize,
    has_mask: bool,
}

impl Kernel for Sdpa {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let (q, k, v, s) = (
            shape_of(inputs, 0)?,
            shape_of(inputs, 1)?,
            shape_of(inputs, 2)?,
            shape_of(inputs, 3)?,
        );
        if q.len() < 3 || k.len() < 2 || v.len() < 2 || k.len() > q.len() || v.len() != k.len() {
            return Err(format!(
                "query {q:?}, key {k:?} and value {v:?} ranks do not fit"
            ));
        }
        let r = q.len();
        let at = |x: &[usize], i: usize| x.get(i).copied().unwrap_or(1);
        let (t, c) = (at(q, r - 2), at(q, r - 1));
        let kr = k.len();
        let (u, ck) = (at(k, kr - 2), at(k, kr - 1));
        let (uv, d) = (at(v, kr - 2), at(v, kr - 1));
        if ck != c || uv != u {
            return Err(format!("key {k:?} or value {v:?} do not match query {q:?}"));
        }
        if s != [c] {
            return Err(format!("scale {s:?} is not [{c}]"));
        }
        if self.has_mask {
            let m = shape_of(inputs, 4)?;
            if m != [t, u] {
                return Err(format!("mask {m:?} is not [{t}, {u}]"));
            }
        }
        let batch: Dims = q.get(..r - 2).unwrap_or_default().iter().copied().collect();
        let mut kv: Dims = std::iter::repeat_n(1, r - kr).collect();
        kv.extend(k.get(..kr - 2).unwrap_or_default().iter().copied());
        for (&a, &b) in batch.iter().zip(&kv) {
            if b != 1 && b != a {
                return Err(format!("key batch {k:?} does not broadcast to {q:?}"));
            }
        }
        let vb: Dims = v
            .get(..kr - 2)
            .unwrap_or_default()
            .iter()
            .copied()
            .collect();
        if vb.as_slice() != k.get(..kr - 2).unwrap_or_default() {
            return Err(format!("value {v:?} and key {k:?} batches differ"));
        }
        let mut out = batch.clone();
        out.push(t);
        out.push(d);
        (self.t, self.u, self.c, self.d) = (t, u, c, d);
        self.batch = batch;
        self.kv_batch = kv;
        set_shape(outputs, 0, &out)
    }

    fn scratch_bytes(&self, threads: usize) -> usize {
        let g1 = self
            .gemm
            .scratch_len(self.t, self.u, self.c, false, false, threads)
            .unwrap_or(usize::MAX / 16);
        let g2 = self
            .gemm
            .scratch_len(self.t, self.d, self.u, false, false, threads)
            .unwrap_or(usize::MAX / 16);
        (g1.max(g2) + 2 * self.t * self.u + self.t * self.c) * 4
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let (t, u, c, d) = (self.t, self.u, self.c, self.d);
        let q = f32s(arg(inputs, 0)?.bytes, numel(arg(inputs, 0)?.dims))?;
        let k = f32s(arg(inputs, 1)?.bytes, numel(arg(inputs, 1)?.dims))?;
        let v = f32s(arg(inputs, 2)?.bytes, numel(arg(inputs, 2)?.dims))?;
        let scale = f32s(arg(inputs, 3)?.bytes, c)?;
        let mask = if self.has_mask {
            Some(f32s(arg(inputs, 4)?.bytes, t * u)?)
        } else {
            None
        };
        let count = numel(&self.batch);
        let out = f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, count * t * d)?;
        let g = self
            .gemm
            .scratch_len(t, u, c, false, false, cx.pool.threads())
            .map_err(|e| e.to_string())?
            .max(
                self.gemm
                    .scratch_len(t, d, u, false, false, cx.pool.threads())
                    .map_err(|e| e.to_string())?,
            );
        let all = cx
            .scratch
            .slice_mut::<f32>(g + 2 * t * u + t * c)
            .map_err(|e| e.to_string())?;
        let (gs, rest) = all.split_at_mut(g);
        let (logits, rest) = rest.split_at_mut(t * u);
        let (probs, qs) = rest.split_at_mut(t * u);
        let epi = Epilogue::default();
        let mut idx: Dims = std::iter::repeat_n(0, self.batch.len()).collect();
        for o in out.chunks_exact_mut((t * d).max(1)).take(count) {
            let qo = idx.iter().zip(&self.batch).fold(0, |a, (&i, &n)| a * n + i) * t * c;
            let ko = idx
                .iter()
                .zip(&self.kv_batch)
                .fold(0, |a, (&i, &n)| a * n + if n == 1 { 0 } else { i });
            // Query scaled per channel.
            for (row, src) in qs.chunks_exact_mut(c.max(1)).zip(
                q.get(qo..qo + t * c)
                    .unwrap_or_default()
                    .chunks_exact(c.max(1)),
            ) {
                for ((o, &x), &s) in row.iter_mut().zip(src).zip(scale) {
                    *o = x * s;
                }
            }
            let km = MatRef::row_major(
                k.get(ko * u * c..(ko + 1) * u * c).unwrap_or_default(),
                u,
                c,
            )
            .map_err(|e| e.to_string())?;
            self.gemm
                .run(
                    cx.pool,
                    MatMut::row_major(logits, t, u).map_err(|e| e.to_string())?,
                    Lhs::Mat(MatRef::row_major(qs, t, c).map_err(|e| e.to_string())?),
                    Rhs::Mat(km.t()),
                    &epi,
                    gs,
                )
                .map_err(|e| e.to_string())?;
            if let Some(m) = mask {
                for (l, &mv) in logits.iter_mut().zip(m) {
                    *l += mv;
                }
            }
            if u > 0 {
                pte_compute::elementwise::softmax_rows(self.isa, probs, logits, u)
                    .map_err(|e| e.to_string())?;
            }
            let vm = MatRef::row_major(
                v.get(ko * u * d..(ko + 1) * u * d).unwrap_or_default(),
                u,
                d,
            )
            .map_err(|e| e.to_string())?;
            self.gemm
                .run(
                    cx.pool,
                    MatMut::row_major(o, t, d).map_err(|e| e.to_string())?,
                    Lhs::Mat(MatRef::row_major(probs, t, u).map_err(|e| e.to_string())?),
                    Rhs::Mat(vm),
                    &epi,
                    gs,
                )
                .map_err(|e| e.to_string())?;
            for k in (0..idx.len()).rev() {
                if let (Some(i), Some(&n)) = (idx.get_mut(k), self.batch.get(k)) {
                    *i += 1;
                    if *i < n {
                        break;
                    }
                    *i = 0;
                }
            }
        }
        Ok(())
    }
}

/// ScaledDotProductAttention (float): `softmax((Q · scale) Kᵀ + mask) V`, the scale
/// one value per channel of the query, the mask `[T, U]` added to the logits, key and
/// value broadcast over the query's batch dimensions.
pub(crate) fn sdpa(cx: &NodeCx<'_>) -> PResult<Prepared> {
    let mut all = vec![
        cx.input(0)?,
        cx.input(1)?,
        cx.input(2)?,
        cx.input(3)?,
        cx.output(0)?,
    ];
    let mask = cx.opt_input(4)?;
    if let Some(m) = mask {
        all.push(m);
    }
    if !cx.all_float(&all) {
        return Err("scaled dot-product attention needs float values".into());
    }
    Prepared::new(Sdpa {
        gemm: Gemm::new(),
        isa: Isa::best(),
        batch: Dims::new(),
        kv_batch: Dims::new(),
        t: 0,
        u: 0,
        c: 0,
        d: 0,
        has_mask: mask.is_some(),
    })
}
