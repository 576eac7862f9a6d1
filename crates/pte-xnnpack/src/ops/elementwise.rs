//! Elementwise nodes: unary functions and clamp, binary operations with broadcasting,
//! PReLU, and conversions between float, 8-bit and dynamically quantized values.
//!
//! Float nodes run pte-compute's vectorized loops. 8-bit unary nodes use a 256-entry
//! table computed once from the float function (as XNNPACK's lookup-table kernels do).
//! 8-bit addition and subtraction use XNNPACK's fixed-point formula, multiplication its
//! fp32 requantization.

use pte_compute::broadcast::Broadcast;
use pte_compute::elementwise::Activation;
use pte_compute::elementwise::BinaryOp as BinaryFn;
use pte_compute::qelementwise::QMul;
use pte_compute::unary::UnaryFn;
use pte_compute::Isa;

use super::quant::{self, AddParams, Requant, Q8};
use super::{
    arg, bytes, bytes_mut, describe, f32s, f32s_mut, family, numel, set_shape, shape_of, Family,
    KResult, Kernel, NodeCx, PResult, Prepared,
};
use crate::exec::{Cx, In, Out};
use crate::graph::{BinaryOp, Datatype, Dims, Quant, UnaryOp};

/// Elements below which a node runs on one thread.
const PARALLEL: usize = 1 << 15;

/// The pte-compute function of a unary node (`Clamp`: identity, bounds applied after).
fn unary_fn(op: UnaryOp) -> UnaryFn {
    match op {
        UnaryOp::Abs => UnaryFn::Abs,
        UnaryOp::Negate => UnaryFn::Negate,
        UnaryOp::Square => UnaryFn::Square,
        UnaryOp::SquareRoot => UnaryFn::Sqrt,
        UnaryOp::ReciprocalSquareRoot => UnaryFn::Rsqrt,
        UnaryOp::Floor => UnaryFn::Floor,
        UnaryOp::Ceiling => UnaryFn::Ceil,
        UnaryOp::Exp => UnaryFn::Exp,
        UnaryOp::Log => UnaryFn::Log,
        UnaryOp::Sin => UnaryFn::Sin,
        UnaryOp::Cos => UnaryFn::Cos,
        UnaryOp::Tanh => UnaryFn::Act(Activation::Tanh),
        UnaryOp::Sigmoid => UnaryFn::Act(Activation::Sigmoid),
        UnaryOp::Gelu => UnaryFn::Act(Activation::Gelu),
        UnaryOp::Hardswish => UnaryFn::Act(Activation::HardSwishFused),
        UnaryOp::Elu { alpha } => UnaryFn::Elu { alpha },
        UnaryOp::LeakyRelu { slope } => UnaryFn::LeakyRelu { slope },
        UnaryOp::Clamp => UnaryFn::Act(Activation::Identity),
        UnaryOp::Silu => UnaryFn::Act(Activation::Silu),
    }
}

/// Output shape = input shape.
fn same_shape(inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
    let s = shape_of(inputs, 0)?;
    set_shape(outputs, 0, s)
}

/// Runs `f(start, out_chunk)` over chunks of `out` on the pool.
pub(crate) fn split<T: Send>(
    cx: &Cx<'_>,
    out: &mut [T],
    f: impl Fn(usize, &mut [T]) + Sync,
) -> KResult {
    if out.len() < PARALLEL || cx.pool.threads() == 1 {
        f(0, out);
        return Ok(());
    }
    let chunk = out.len().div_ceil(cx.pool.threads() * 4).max(4096);
    cx.pool
        .parallel_chunks(out, chunk, &mut [0u8; 0], 0, |i, c, _| f(i * chunk, c))
        .map_err(|e| e.to_string())
}

/// Runs `f(start, chunk)` over chunks of whole rows of `row` elements of `out` (at
/// least `rows_per` rows each) on the pool.
pub(crate) fn split_rows<T: Send>(
    cx: &Cx<'_>,
    out: &mut [T],
    row: usize,
    rows_per: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> KResult {
    if out.len() < PARALLEL || cx.pool.threads() == 1 || row == 0 {
        f(0, out);
        return Ok(());
    }
    let rows = out.len() / row;
    let per = rows.div_ceil(cx.pool.threads() * 4).max(rows_per).max(1);
    let chunk = per * row;
    cx.pool
        .parallel_chunks(out, chunk, &mut [0u8; 0], 0, |i, c, _| f(i * chunk, c))
        .map_err(|e| e.to_string())
}

struct FloatUnary {
    f: UnaryFn,
    min: f32,
    max: f32,
    isa: Isa,
}

impl Kernel for FloatUnary {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        same_shape(inputs, outputs)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let n = numel(x.dims);
        let x = f32s(x.bytes, n)?;
        let out = f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, n)?;
        split(cx, out, |start, o| {
            let xs = x.get(start..start + o.len()).unwrap_or_default();
            let _ = pte_compute::unary::unary(self.isa, self.f, xs, o, self.min, self.max);
        })
    }
}

/// An 8-bit node computed through a 256-entry table.
struct Lookup<T> {
    table: [T; 256],
}

impl<T: Q8> Kernel for Lookup<T> {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        same_shape(inputs, outputs)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let n = numel(x.dims);
        let x: &[T] = bytemuck::cast_slice(bytes(x.bytes, n)?);
        let out: &mut [T] =
            bytemuck::cast_slice_mut(bytes_mut(outputs.first_mut().ok_or("no output")?.bytes, n)?);
        split(cx, out, |start, o| {
            for (o, &v) in o.iter_mut().zip(x.get(start..).unwrap_or_default()) {
                *o = self
                    .table
                    .get((v.get() - T::MIN) as usize)
                    .copied()
                    .unwrap_or(*o);
            }
        })
    }
}

/// The table of `f` from the input's to the output's quantization, clamped to the
/// quantized bounds.
fn table<T: Q8>(
    f: impl Fn(f32) -> f32,
    (si, zi): (f32, i32),
    (so, zo): (f32, i32),
    (lo, hi): (i32, i32),
) -> [T; 256] {
    let mut t = [T::from_i32(0); 256];
    for (k, slot) in t.iter_mut().enumerate() {
        let q = k as i32 + T::MIN;
        let x = si * (q - zi) as f32;
        let y = f(x) / so;
        let v = if y.is_nan() {
            zo
        } else {
            quant::rint(y.clamp(-1e9, 1e9)).saturating_add(zo)
        };
        *slot = T::from_i32(v.clamp(lo, hi));
    }
    t
}

fn quant_pair(cx: &NodeCx<'_>) -> PResult<((f32, i32), (f32, i32))> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    match (x.per_tensor(), y.per_tensor()) {
        (Some(a), Some(b)) if family(x) == family(y) => Ok((a, b)),
        _ => Err(format!("unsupported types {} -> {}", describe(x), describe(y)).into()),
    }
}

fn lookup(cx: &NodeCx<'_>, f: impl Fn(f32) -> f32) -> PResult<Prepared> {
    let (i, o) = quant_pair(cx)?;
    let (min, max) = cx.bounds()?;
    match family(cx.output(0)?) {
        Family::QInt8 => {
            let b = quant::bounds::<i8>(min, max, o.0, o.1);
            Prepared::new(Lookup::<i8> {
                table: table(f, i, o, b),
            })
        }
        Family::QUInt8 => {
            let b = quant::bounds::<u8>(min, max, o.0, o.1);
            Prepared::new(Lookup::<u8> {
                table: table(f, i, o, b),
            })
        }
        _ => Err("unsupported quantized type".into()),
    }
}

/// A unary node (including Clamp, ELU, LeakyReLU).
pub(crate) fn unary(cx: &NodeCx<'_>, op: UnaryOp) -> PResult<Prepared> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    let (min, max) = match op {
        // Only Clamp carries bounds in XNNPACK's unary definitions.
        UnaryOp::Clamp => cx.bounds()?,
        _ => (f32::NEG_INFINITY, f32::INFINITY),
    };
    let f = unary_fn(op);
    if cx.all_float(&[x, y]) {
        return Prepared::new(FloatUnary {
            f,
            min,
            max,
            isa: Isa::best(),
        });
    }
    lookup(cx, move |v| f.apply_scalar(v).max(min).min(max))
}

struct FloatBinary {
    op: BinaryFn,
    min: f32,
    max: f32,
    plan: Option<Broadcast>,
    isa: Isa,
}

fn broadcast_shape(a: &[usize], b: &[usize]) -> KResult<Dims> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        (i + s.len())
            .checked_sub(rank)
            .and_then(|j| s.get(j))
            .copied()
            .unwrap_or(1)
    };
    (0..rank)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            if x == y || y == 1 {
                Ok(x)
            } else if x == 1 {
                Ok(y)
            } else {
                Err(format!("shapes {a:?} and {b:?} do not broadcast"))
            }
        })
        .collect()
}

impl Kernel for FloatBinary {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let (a, b) = (shape_of(inputs, 0)?, shape_of(inputs, 1)?);
        let out = broadcast_shape(a, b)?;
        self.plan = Some(Broadcast::new(a, b).map_err(|e| e.to_string())?);
        set_shape(outputs, 0, &out)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let (a, b) = (arg(inputs, 0)?, arg(inputs, 1)?);
        let plan = self.plan.as_ref().ok_or("not reshaped")?;
        let x = f32s(a.bytes, numel(a.dims))?;
        let y = f32s(b.bytes, numel(b.dims))?;
        let out = f32s_mut(outputs.first_mut().ok_or("no output")?.bytes, plan.numel())?;
        if a.dims == b.dims && out.len() >= PARALLEL {
            // Same shapes: split across threads.
            return split(cx, out, |start, o| {
                let xs = x.get(start..start + o.len()).unwrap_or_default();
                let ys = y.get(start..start + o.len()).unwrap_or_default();
                let _ =
                    pte_compute::broadcast::same(self.isa, self.op, o, xs, ys, self.min, self.max);
            });
        }
        // Broadcast: split in whole runs of the innermost dimension.
        let failed = std::sync::Mutex::new(None);
        split_rows(cx, out, plan.run_len(), 1, |start, o| {
            let r = plan.run_part(self.isa, self.op, start, o, x, y, self.min, self.max);
            if let (Err(e), Ok(mut slot)) = (r, failed.lock()) {
                slot.get_or_insert(e.to_string());
            }
        })?;
        match failed.into_inner() {
            Ok(Some(e)) => Err(e),
            _ => Ok(()),
        }
    }
}

/// Quantized binary nodes, element by element over broadcast indices.
struct QuantBinary<T> {
    op: QOp,
    out_shape: Dims,
    a_shape: Dims,
    b_shape: Dims,
    lo: i32,
    hi: i32,
    _t: std::marker::PhantomData<T>,
}

#[derive(Clone, Copy)]
enum QOp {
    Add(AddParams),
    Mul(QMul),
    /// Minimum / maximum on dequantized values (rare in quantized graphs).
    MinMax {
        min: bool,
        a: (f32, i32),
        b: (f32, i32),
        o: (f32, i32),
    },
}

/// Offsets into a and b for each output element, broadcasting right-aligned (index
/// vectors inline, at most `MAX_DIMS` long: nothing allocates).
fn for_each_broadcast(
    out: &[usize],
    a: &[usize],
    b: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    let rank = out.len();
    let strides = |s: &[usize]| -> Dims {
        let mut st: Dims = std::iter::repeat_n(0, rank).collect();
        let mut acc = 1usize;
        for k in (0..rank).rev() {
            let d = (k + s.len())
                .checked_sub(rank)
                .and_then(|j| s.get(j))
                .copied()
                .unwrap_or(1);
            if let Some(x) = st.get_mut(k) {
                *x = if d == 1 { 0 } else { acc };
            }
            acc *= d;
        }
        st
    };
    let (sa, sb) = (strides(a), strides(b));
    let n = numel(out);
    let mut idx: Dims = std::iter::repeat_n(0, rank).collect();
    let (mut oa, mut ob) = (0usize, 0usize);
    for i in 0..n {
        f(i, oa, ob);
        for k in (0..rank).rev() {
            let (Some(ix), Some(&d)) = (idx.get_mut(k), out.get(k)) else {
                break;
            };
            *ix += 1;
            oa += sa.get(k).copied().unwrap_or(0);
            ob += sb.get(k).copied().unwrap_or(0);
            if *ix < d {
                break;
            }
            oa -= sa.get(k).copied().unwrap_or(0) * d;
            ob -= sb.get(k).copied().unwrap_or(0) * d;
            *ix = 0;
        }
    }
}

impl<T: Q8> Kernel for QuantBinary<T> {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        let (a, b) = (shape_of(inputs, 0)?, shape_of(inputs, 1)?);
        self.out_shape = broadcast_shape(a, b)?;
        self.a_shape = a.iter().copied().collect();
        self.b_shape = b.iter().copied().collect();
        let s = self.out_shape.clone();
        set_shape(outputs, 0, &s)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let (a, b) = (arg(inputs, 0)?, arg(inputs, 1)?);
        let x: &[T] = bytemuck::cast_slice(bytes(a.bytes, numel(a.dims))?);
        let y: &[T] = bytemuck::cast_slice(bytes(b.bytes, numel(b.dims))?);
        let n = numel(&self.out_shape);
        let out: &mut [T] =
            bytemuck::cast_slice_mut(bytes_mut(outputs.first_mut().ok_or("no output")?.bytes, n)?);
        let (lo, hi) = (self.lo, self.hi);
        let op = self.op;
        let f = |p: T, q: T| {
            let v = match op {
                QOp::Add(params) => params.apply::<T>(p.get(), q.get()),
                QOp::Mul(mul) => mul.apply(p.get(), q.get()),
                QOp::MinMax { min, a, b, o } => {
                    let fa = a.0 * (p.get() - a.1) as f32;
                    let fb = b.0 * (q.get() - b.1) as f32;
                    let r = if min { fa.min(fb) } else { fa.max(fb) };
                    quant::rint(r / o.0) + o.1
                }
            };
            T::from_i32(v.clamp(lo, hi))
        };
        if let Some((w, a_is_row)) = row_broadcast(&self.out_shape, &self.a_shape, &self.b_shape) {
            // One operand a row repeated over the other (a squeeze-excitation gate, a
            // per-channel term): row by row, split over the threads.
            let (full, row) = if a_is_row { (y, x) } else { (x, y) };
            let (full, row) = (
                full.get(..n).unwrap_or_default(),
                row.get(..w).unwrap_or_default(),
            );
            match op {
                QOp::Add(params) => {
                    let add = params.with_bounds(lo, hi);
                    let add = if a_is_row { add.swapped() } else { add };
                    return add
                        .run_rows(cx.pool, full, row, out)
                        .map_err(|e| e.to_string());
                }
                QOp::Mul(mul) => {
                    let mul = if a_is_row { mul.swapped() } else { mul };
                    return mul
                        .run_rows(cx.pool, full, row, out)
                        .map_err(|e| e.to_string());
                }
                QOp::MinMax { .. } => {}
            }
        }
        if self.a_shape == self.out_shape && self.b_shape == self.out_shape {
            // No broadcast (a residual addition): one pass, split over the threads.
            let (x, y) = (
                x.get(..n).unwrap_or_default(),
                y.get(..n).unwrap_or_default(),
            );
            match op {
                QOp::Add(params) => {
                    let add = params.with_bounds(lo, hi);
                    return add.run(cx.pool, x, y, out).map_err(|e| e.to_string());
                }
                QOp::Mul(mul) => return mul.run(cx.pool, x, y, out).map_err(|e| e.to_string()),
                QOp::MinMax { .. } => {}
            }
            let chunks =
                cx.pool
                    .parallel_chunks(out, SAME_SHAPE_CHUNK, &mut [0u8; 0], 0, |k, o, _| {
                        let at = k * SAME_SHAPE_CHUNK;
                        let (x, y) = (
                            x.get(at..).unwrap_or_default(),
                            y.get(at..).unwrap_or_default(),
                        );
                        for ((o, &p), &q) in o.iter_mut().zip(x).zip(y) {
                            *o = f(p, q);
                        }
                    });
            return chunks.map_err(|e| e.to_string());
        }
        for_each_broadcast(
            &self.out_shape,
            &self.a_shape,
            &self.b_shape,
            |i, ia, ib| {
                if let (Some(&p), Some(&q), Some(o)) = (x.get(ia), y.get(ib), out.get_mut(i)) {
                    *o = f(p, q);
                }
            },
        );
        Ok(())
    }
}

/// Row lengths below which a repeated row takes the general broadcast (a call per row
/// would cost more than the row).
const MIN_ROW: usize = 8;

/// When one operand has the output's shape and the other is one of its rows repeated
/// (`[1, 1, 1, C]` against `[N, H, W, C]`): the row's length, and whether the row is
/// operand a.
fn row_broadcast(out: &[usize], a: &[usize], b: &[usize]) -> Option<(usize, bool)> {
    let row = |s: &[usize]| {
        let tail = s.get(s.iter().take_while(|&&d| d == 1).count()..)?;
        let w = numel(tail);
        (out.ends_with(tail) && w >= MIN_ROW && w < numel(out)).then_some(w)
    };
    if a == out {
        row(b).map(|w| (w, false))
    } else if b == out {
        row(a).map(|w| (w, true))
    } else {
        None
    }
}

/// Elements of a same-shape 8-bit binary node per task.
const SAME_SHAPE_CHUNK: usize = 16 * 1024;

fn quant_binary<T: Q8>(cx: &NodeCx<'_>, op: BinaryOp) -> PResult<Prepared> {
    let (a, b, o) = (cx.input(0)?, cx.input(1)?, cx.output(0)?);
    let (Some(qa), Some(qb), Some(qo)) = (a.per_tensor(), b.per_tensor(), o.per_tensor()) else {
        return Err("quantized binary nodes need per-tensor quantization".into());
    };
    let (min, max) = cx.bounds()?;
    let (lo, hi) = quant::bounds::<T>(min, max, qo.0, qo.1);
    let qop = match op {
        BinaryOp::Add | BinaryOp::Subtract => {
            let sign = if op == BinaryOp::Subtract { -1.0 } else { 1.0 };
            QOp::Add(
                AddParams::new(qa, (qb.0 * sign, qb.1), qo)
                    .ok_or("input to output scale ratios are outside 2^-10 .. 2^8")?,
            )
        }
        BinaryOp::Multiply => QOp::Mul(QMul {
            a_zero: qa.1,
            b_zero: qb.1,
            scale: qa.0 * qb.0 / qo.0,
            zero: qo.1,
            min: lo,
            max: hi,
        }),
        BinaryOp::Minimum | BinaryOp::Maximum => QOp::MinMax {
            min: op == BinaryOp::Minimum,
            a: qa,
            b: qb,
            o: qo,
        },
        BinaryOp::Divide => return Err("quantized division is not supported".into()),
    };
    Prepared::new(QuantBinary::<T> {
        op: qop,
        out_shape: Dims::new(),
        a_shape: Dims::new(),
        b_shape: Dims::new(),
        lo,
        hi,
        _t: std::marker::PhantomData,
    })
}

/// A binary node.
pub(crate) fn binary(cx: &NodeCx<'_>, op: BinaryOp) -> PResult<Prepared> {
    let (a, b, o) = (cx.input(0)?, cx.input(1)?, cx.output(0)?);
    let (min, max) = match op {
        // XNNPACK's minimum and maximum take no bounds.
        BinaryOp::Minimum | BinaryOp::Maximum => (f32::NEG_INFINITY, f32::INFINITY),
        _ => cx.bounds()?,
    };
    if cx.all_float(&[a, b, o]) {
        let f = match op {
            BinaryOp::Add => BinaryFn::Add,
            BinaryOp::Subtract => BinaryFn::Sub,
            BinaryOp::Multiply => BinaryFn::Mul,
            BinaryOp::Divide => BinaryFn::Div,
            BinaryOp::Minimum => BinaryFn::Min,
            BinaryOp::Maximum => BinaryFn::Max,
        };
        return Prepared::new(FloatBinary {
            op: f,
            min,
            max,
            plan: None,
            isa: Isa::best(),
        });
    }
    match (family(a), family(b), family(o)) {
        (Family::QInt8, Family::QInt8, Family::QInt8) => quant_binary::<i8>(cx, op),
        (Family::QUInt8, Family::QUInt8, Family::QUInt8) => quant_binary::<u8>(cx, op),
        _ => Err(format!(
            "unsupported types {}, {} -> {}",
            describe(a),
            describe(b),
            describe(o)
        )
        .into()),
    }
}

/// PReLU: `x` where `x >= 0`, else `x · slope`, the slope broadcast against x.
pub(crate) fn prelu(cx: &NodeCx<'_>) -> PResult<Prepared> {
    let (a, b, o) = (cx.input(0)?, cx.input(1)?, cx.output(0)?);
    if !cx.all_float(&[a, b, o]) {
        return Err(format!("PReLU of {} is not supported", describe(a)).into());
    }
    Prepared::new(FloatBinary {
        op: BinaryFn::Prelu,
        min: f32::NEG_INFINITY,
        max: f32::INFINITY,
        plan: None,
        isa: Isa::best(),
    })
}

/// What a Convert node does.
#[derive(Clone, Copy)]
enum Conversion {
    /// Float to float: a copy (the executor rounds to the output's precision).
    Float,
    /// Float to 8-bit: `rint(x / scale) + zero_point`, saturated.
    Quantize { inv_scale: f32, zero_point: i32 },
    /// 8-bit to float: `(q - zero_point) · scale`.
    Dequantize { scale: f32, zero_point: i32 },
    /// 8-bit to 8-bit of other parameters.
    Requantize {
        zi: i32,
        scale: f32,
        requant: Requant,
    },
    /// Float to int8 with per-row parameters computed from each row's range.
    Dynamic { nonbatch_dims: usize },
}

struct Convert {
    conv: Conversion,
    from: Family,
    to: Family,
}

impl Kernel for Convert {
    fn reshape(&mut self, inputs: &[Option<&[usize]>], outputs: &mut [Dims]) -> KResult {
        same_shape(inputs, outputs)
    }

    fn run(&self, cx: &mut Cx<'_>, inputs: &[Option<In<'_>>], outputs: &mut [Out<'_>]) -> KResult {
        let x = arg(inputs, 0)?;
        let n = numel(x.dims);
        let out = outputs.first_mut().ok_or("no output")?;
        match (self.conv, self.from, self.to) {
            (Conversion::Float, _, _) => {
                let src = f32s(x.bytes, n)?;
                f32s_mut(out.bytes, n)?.copy_from_slice(src);
            }
            (
                Conversion::Quantize {
                    inv_scale,
                    zero_point,
                },
                _,
                Family::QInt8,
            ) => {
                quantize::<i8>(
                    cx,
                    f32s(x.bytes, n)?,
                    bytemuck::cast_slice_mut(bytes_mut(out.bytes, n)?),
                    inv_scale,
                    zero_point,
                )?;
            }
            (
                Conversion::Quantize {
                    inv_scale,
                    zero_point,
                },
                _,
                _,
            ) => {
                quantize::<u8>(
                    cx,
                    f32s(x.bytes, n)?,
                    bytemuck::cast_slice_mut(bytes_mut(out.bytes, n)?),
                    inv_scale,
                    zero_point,
                )?;
            }
            (Conversion::Dequantize { scale, zero_point }, Family::QInt8, _) => {
                dequantize::<i8>(
                    cx,
                    bytemuck::cast_slice(bytes(x.bytes, n)?),
                    f32s_mut(out.bytes, n)?,
                    scale,
                    zero_point,
                )?;
            }
            (Conversion::Dequantize { scale, zero_point }, _, _) => {
                dequantize::<u8>(
                    cx,
                    bytemuck::cast_slice(bytes(x.bytes, n)?),
                    f32s_mut(out.bytes, n)?,
                    scale,
                    zero_point,
                )?;
            }
            (Conversion::Requantize { zi, scale, requant }, from, _) => {
                let src = bytes(x.bytes, n)?;
                let dst = bytes_mut(out.bytes, n)?;
                for (o, &v) in dst.iter_mut().zip(src) {
                    let q = if from == Family::QInt8 {
                        i32::from(v as i8)
                    } else {
                        i32::from(v)
                    };
                    let r = requant.apply(q - zi, scale);
                    *o = if self.to == Family::QInt8 {
                        r as i8 as u8
                    } else {
                        r as u8
                    };
                }
            }
            (Conversion::Dynamic { nonbatch_dims }, _, _) => {
                let src = f32s(x.bytes, n)?;
                let row = numel(
                    x.dims
                        .get(x.dims.len().saturating_sub(nonbatch_dims)..)
                        .unwrap_or_default(),
                );
                dynamic_quantize(cx, src, row, out.bytes)?;
            }
        }
        Ok(())
    }
}

fn quantize<T: Q8>(cx: &Cx<'_>, x: &[f32], out: &mut [T], inv_scale: f32, zp: i32) -> KResult {
    split(cx, out, |start, o| {
        let x = x.get(start..start + o.len()).unwrap_or_default();
        T::quantize(x, o, inv_scale, zp);
    })
}

fn dequantize<T: Q8>(cx: &Cx<'_>, x: &[T], out: &mut [f32], scale: f32, zp: i32) -> KResult {
    split(cx, out, |start, o| {
        let x = x.get(start..start + o.len()).unwrap_or_default();
        T::dequantize(x, o, scale, zp);
    })
}

/// Quantizes rows of `row` floats to int8 with per-row parameters, written after the
/// int8 data (see [`row_params`]), as XNNPACK's dynamic quantization does.
pub(crate) fn dynamic_quantize(cx: &Cx<'_>, x: &[f32], row: usize, out: &mut [u8]) -> KResult {
    let rows = x.len().checked_div(row).unwrap_or(0);
    let data_len = x.len().div_ceil(8) * 8;
    let (data, params) = out
        .split_at_mut_checked(data_len)
        .ok_or("dynamic quantization output too small")?;
    let params: &mut [[f32; 2]] = bytemuck::try_cast_slice_mut(
        params
            .get_mut(..rows * 8)
            .ok_or("no room for row parameters")?,
    )
    .map_err(|e| format!("misaligned row parameters: {e}"))?;
    let data: &mut [i8] = bytemuck::cast_slice_mut(data.get_mut(..x.len()).unwrap_or_default());
    if row == 0 {
        return Ok(());
    }
    let _ = cx;
    for ((xr, qr), p) in x
        .chunks_exact(row)
        .zip(data.chunks_exact_mut(row))
        .zip(params.iter_mut())
    {
        let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
        for &v in xr {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        // XNNPACK's asymmetric parameters: the range always includes 0.
        let (rmin, rmax) = (lo.min(0.0), hi.max(0.0));
        let scale = if rmin == rmax {
            1.0
        } else {
            255.0 / (rmax - rmin)
        };
        let (dmin, dmax) = (rmin * scale, rmax * scale);
        let zp = if (-128.0 + dmin) + (127.0 + dmax) > 0.0 {
            -128.0 - dmin
        } else {
            127.0 - dmax
        };
        let zp = quant::rint(zp.clamp(-128.0, 127.0));
        let (qlo, qhi) = ((-128 - zp) as f32, (127 - zp) as f32);
        for (q, &v) in qr.iter_mut().zip(xr) {
            let s = (v * scale).max(qlo).min(qhi);
            *q = (quant::rint(s) + zp).clamp(-128, 127) as i8;
        }
        *p = [1.0 / scale, zp as f32];
    }
    Ok(())
}

/// The dequantization scale and zero point (as a float) of each row of a dynamically
/// quantized value of `numel` elements.
pub(crate) fn row_params(bytes: &[u8], numel: usize, rows: usize) -> KResult<&[[f32; 2]]> {
    let start = numel.div_ceil(8) * 8;
    let p = bytes
        .get(start..start + rows * 8)
        .ok_or("row parameters missing")?;
    bytemuck::try_cast_slice(p).map_err(|e| format!("misaligned row parameters: {e}"))
}

/// A Convert node.
pub(crate) fn convert(cx: &NodeCx<'_>) -> PResult<Prepared> {
    let (x, y) = (cx.input(0)?, cx.output(0)?);
    let (from, to) = (family(x), family(y));
    let conv = match (from, to, &y.quant) {
        (Family::Float, Family::Float, _) => Conversion::Float,
        (Family::Float, Family::QInt8 | Family::QUInt8, Quant::PerTensor { scale, zero_point }) => {
            Conversion::Quantize {
                inv_scale: 1.0 / scale,
                zero_point: *zero_point,
            }
        }
        (Family::QInt8 | Family::QUInt8, Family::Float, _) => {
            let (scale, zero_point) = x.per_tensor().ok_or("input needs per-tensor parameters")?;
            Conversion::Dequantize { scale, zero_point }
        }
        (Family::QInt8 | Family::QUInt8, Family::QInt8 | Family::QUInt8, _) => {
            let ((si, zi), (so, zo)) = match (x.per_tensor(), y.per_tensor()) {
                (Some(a), Some(b)) => (a, b),
                _ => return Err("8-bit conversion needs per-tensor parameters".into()),
            };
            let (lo, hi) = if to == Family::QInt8 {
                (-128, 127)
            } else {
                (0, 255)
            };
            Conversion::Requantize {
                zi,
                scale: si / so,
                requant: Requant::new(zo, lo, hi),
            }
        }
        (Family::Float, Family::Other(Datatype::QdInt8), Quant::PerToken { nonbatch_dims }) => {
            Conversion::Dynamic {
                nonbatch_dims: *nonbatch_dims,
            }
        }
        _ => {
            return Err(format!(
                "conversion {} -> {} is not supported",
                describe(x),
                describe(y)
            )
            .into())
        }
    };
    Prepared::new(Convert { conv, from, to })
}
