//! Elementwise and row-wise float32 operators on `pte_compute::elementwise`:
//! activations, `add` / `sub` / `mul` of equal shapes, of a per-channel or a trailing
//! vector, or of a scalar; softmax over the last dimension; layer normalization over
//! trailing dimensions; `mean` over trailing dimensions. Large tensors are split over
//! the method's thread pool.
//!
//! Shapes are read at every call; a call whose shapes no longer fit one of these cases
//! (dynamic shapes) runs the generic kernel prepared beside it.

use pte_compute::elementwise::{self, BinaryOp};
use pte_compute::{pooling, Activation, Isa, ThreadPool};
use pte_runtime::{Arg, Args, Kernel, KernelError, KernelResult, PreparedKernel, Scalar};
use smallvec::SmallVec;

use super::conv::Act;
use super::{at, compute, f32_tensor, views};

/// Elements below which an elementwise loop stays on one thread.
const PARALLEL: usize = 1 << 12;

/// Runs `f(offset, chunk)` over chunks of `out` (multiples of `unit` elements) on the
/// pool's threads when `out` is large.
pub(super) fn split(
    pool: &ThreadPool,
    out: &mut [f32],
    unit: usize,
    f: impl Fn(usize, &mut [f32]) -> pte_compute::Result + Sync,
) -> KernelResult {
    let unit = unit.max(1);
    let chunk = if out.len() >= PARALLEL && pool.threads() > 1 {
        (out.len() / (pool.threads() * 4))
            .max(PARALLEL / 4)
            .div_ceil(unit)
            * unit
    } else {
        out.len().max(1)
    };
    let failed = std::sync::atomic::AtomicBool::new(false);
    pool.parallel_chunks(out, chunk, &mut [0u8; 0], 0, |i, c, _| {
        if f(i * chunk, c).is_err() {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    })
    .map_err(compute)?;
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(KernelError::Failed("elementwise loop failed".into()));
    }
    Ok(())
}

/// A unary activation: input at 0, output at `out`.
struct Unary {
    act: Act,
    out: usize,
}

fn unary(args: &Args<'_>, act: Act, out: usize) -> KernelResult<Option<Box<dyn PreparedKernel>>> {
    let ok = f32_tensor(args, 0)?.is_some() && f32_tensor(args, out)?.is_some();
    if !ok {
        return Ok(None);
    }
    act.resolve(args)?;
    Ok(Some(Box::new(Unary { act, out })))
}

pub(super) fn relu(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    unary(a, Act::Relu, 1)
}

pub(super) fn sigmoid(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    unary(a, Act::Sigmoid, 1)
}

pub(super) fn tanh(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    unary(a, Act::Tanh, 1)
}

pub(super) fn silu(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    unary(a, Act::Silu, 1)
}

pub(super) fn hardswish(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    unary(a, Act::HardSwish, 1)
}

pub(super) fn gelu(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    unary(a, Act::Gelu { approximate: 1 }, 2)
}

pub(super) fn hardtanh(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    unary(a, Act::Clamp { min: 1, max: 2 }, 3)
}

pub(super) fn clamp(a: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    // Absent bounds are infinite; scalar bounds only (`clamp.Tensor_out` is generic).
    let scalar_or_none =
        |i: usize| -> KernelResult<bool> { Ok(a.is_none(i)? || a.scalar(i).is_ok()) };
    if !(scalar_or_none(1)? && scalar_or_none(2)?) {
        return Ok(None);
    }
    unary(a, Act::ClampOptional { min: 1, max: 2 }, 3)
}

impl PreparedKernel for Unary {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let sizes = args.tensor(0)?.sizes;
        args.resize(self.out, &sizes)?;
        let act = self.act.resolve(args)?;
        let pool = args.pool();
        let mut io = args.io(&[at(0)], &[at(self.out)])?;
        let (x, y) = views(&io.inputs, &mut io.outputs)?;
        let isa = Isa::best();
        split(pool, y, 1, |o, c| {
            let x = x.get(o..o + c.len()).unwrap_or_default();
            elementwise::map(isa, c, x, act)
        })
    }
}

/// `add`, `sub`, `mul` (tensor or scalar `other`), with the generic kernel for shapes
/// these loops do not cover.
struct Binary {
    op: BinaryOp,
    /// Position of `alpha` (add, sub), if any.
    alpha: Option<usize>,
    out: usize,
    fallback: Box<dyn PreparedKernel>,
}

/// How `other` lines up with `self`.
enum Shape {
    Same,
    /// One value per channel of an `[outer, channels, inner]` view.
    Channels {
        inner: usize,
    },
    /// A scalar (argument or one-element tensor).
    Scalar,
    /// `other` holds `self`'s last dims (ones before them): it repeats along the rest,
    /// as an attention bias over the batch of heads does.
    Tiled,
}

fn binary(
    args: &Args<'_>,
    generic: &dyn Kernel,
    op: BinaryOp,
    alpha: Option<usize>,
    out: usize,
) -> super::Prepared {
    let other_ok = match args.kind(1)? {
        "Tensor" => f32_tensor(args, 1)?.is_some(),
        "Int" | "Double" => true,
        _ => false,
    };
    if f32_tensor(args, 0)?.is_none() || f32_tensor(args, out)?.is_none() || !other_ok {
        return Ok(None);
    }
    Ok(Some(Box::new(Binary {
        op,
        alpha,
        out,
        fallback: generic.prepare(args)?,
    })))
}

pub(super) fn add(a: &Args<'_>, g: &dyn Kernel) -> super::Prepared {
    binary(a, g, BinaryOp::Add, Some(2), 3)
}

pub(super) fn sub(a: &Args<'_>, g: &dyn Kernel) -> super::Prepared {
    binary(a, g, BinaryOp::Sub, Some(2), 3)
}

pub(super) fn mul(a: &Args<'_>, g: &dyn Kernel) -> super::Prepared {
    binary(a, g, BinaryOp::Mul, None, 2)
}

impl Binary {
    /// The case for the call's current arguments, or None for the generic kernel.
    fn shape(&self, args: &Args<'_>) -> KernelResult<Option<Shape>> {
        if let Some(a) = self.alpha {
            let one = match args.scalar(a)? {
                Scalar::Int(v) => v == 1,
                Scalar::Double(v) => v == 1.0,
                Scalar::Bool(v) => v,
            };
            if !one {
                return Ok(None);
            }
        }
        let x = args.info(0)?;
        if args.kind(1)? != "Tensor" {
            return Ok(Some(Shape::Scalar));
        }
        let y = args.info(1)?;
        if y.sizes == x.sizes {
            return Ok(Some(Shape::Same));
        }
        if y.numel() == 1 && y.rank() <= x.rank() {
            return Ok(Some(Shape::Scalar));
        }
        // `other` of shape [.., C, 1, .., 1] (ones before it too) against `self`
        // holding C at the same axis: a per-channel vector.
        if y.rank() > x.rank() {
            return Ok(None);
        }
        let pad = x.rank() - y.rank();
        let ys = |i: usize| {
            if i < pad {
                1
            } else {
                y.sizes.get(i - pad).copied().unwrap_or(1)
            }
        };
        // Counted, not collected: a call of another shape must not allocate to find out.
        let mut axes = (0..x.rank()).filter(|&i| ys(i) != 1);
        if let (Some(c), None) = (axes.next(), axes.next()) {
            if x.sizes.get(c) == Some(&ys(c)) {
                let inner = x.sizes.get(c + 1..).unwrap_or_default().iter().product();
                // On the last axis, a row of `other` per row of `self`: whole rows at
                // a time, not one value (an LSTM's [1, 1, 512] + [1, 512]).
                return Ok(Some(if inner == 1 && y.numel() > 0 {
                    Shape::Tiled
                } else {
                    Shape::Channels { inner }
                }));
            }
        }
        let tiled = (0..x.rank())
            .skip_while(|&i| ys(i) == 1)
            .all(|i| x.sizes.get(i) == Some(&ys(i)));
        Ok((tiled && y.numel() > 0).then_some(Shape::Tiled))
    }
}

impl PreparedKernel for Binary {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let Some(shape) = self.shape(args)? else {
            return self.fallback.run(args);
        };
        let sizes = args.tensor(0)?.sizes;
        args.resize(self.out, &sizes)?;
        let pool = args.pool();
        let op = self.op;
        let isa = Isa::best();
        let scalar = match (&shape, args.kind(1)?) {
            (Shape::Scalar, "Tensor") => None,
            (Shape::Scalar, _) => Some(args.scalar(1)?.to_f64() as f32),
            _ => None,
        };
        let reads: SmallVec<[Arg; 2]> = if scalar.is_some() {
            SmallVec::from_slice(&[at(0)])
        } else {
            SmallVec::from_slice(&[at(0), at(1)])
        };
        let mut io = args.io(&reads, &[at(self.out)])?;
        let missing = || KernelError::Failed("missing tensor view".into());
        let other = match io.inputs.get(1) {
            Some(t) => t.as_slice::<f32>()?,
            None => &[],
        };
        let (x, y) = views(&io.inputs, &mut io.outputs)?;
        let one = [scalar.or_else(|| other.first().copied()).unwrap_or(0.0)];
        match shape {
            Shape::Same => split(pool, y, 1, |o, c| {
                let n = c.len();
                let (a, b) = (x.get(o..o + n), other.get(o..o + n));
                elementwise::binary(
                    isa,
                    c,
                    a.unwrap_or_default(),
                    b.unwrap_or_default(),
                    op,
                    Activation::Identity,
                )
            }),
            Shape::Scalar => split(pool, y, 1, |o, c| {
                let a = x.get(o..o + c.len()).unwrap_or_default();
                elementwise::binary_channels(isa, c, a, &one, c.len(), op, Activation::Identity)
            }),
            Shape::Tiled => split(pool, y, other.len(), |o, c| {
                let a = x.get(o..o + c.len()).unwrap_or_default();
                for (c, a) in c.chunks_mut(other.len()).zip(a.chunks(other.len())) {
                    elementwise::binary(isa, c, a, other, op, Activation::Identity)?;
                }
                Ok(())
            }),
            Shape::Channels { inner } => {
                let channels = other.len();
                let plane = inner.checked_mul(channels).ok_or_else(missing)?;
                split(pool, y, plane, |o, c| {
                    let a = x.get(o..o + c.len()).unwrap_or_default();
                    elementwise::binary_channels(isa, c, a, other, inner, op, Activation::Identity)
                })
            }
        }
    }
}

/// `_softmax.out(self, dim, half_to_float, out)` over the last dimension (any other
/// dimension runs the generic kernel).
struct Softmax {
    fallback: Box<dyn PreparedKernel>,
}

pub(super) fn softmax(args: &Args<'_>, generic: &dyn Kernel) -> super::Prepared {
    let ok = f32_tensor(args, 0)?.is_some() && f32_tensor(args, 3)?.is_some() && !args.bool(2)?;
    if !ok {
        return Ok(None);
    }
    Ok(Some(Box::new(Softmax {
        fallback: generic.prepare(args)?,
    })))
}

impl PreparedKernel for Softmax {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let x = args.info(0)?;
        if x.dim(args.int(1)?)? + 1 < x.rank() {
            return self.fallback.run(args);
        }
        last_dim_rows(args, 3, elementwise::softmax_rows)
    }
}

/// A softmax of each row (the last dimension) of float32 input 0 into output `out`.
fn last_dim_rows(
    args: &mut Args<'_>,
    out: usize,
    rows: fn(Isa, &mut [f32], &[f32], usize) -> pte_compute::Result,
) -> KernelResult {
    let x = args.tensor(0)?;
    let row = x.sizes.last().copied().unwrap_or(1);
    args.resize(out, &x.sizes)?;
    let pool = args.pool();
    let mut io = args.io(&[at(0)], &[at(out)])?;
    let (x, y) = views(&io.inputs, &mut io.outputs)?;
    let isa = Isa::best();
    split(pool, y, row, |o, c| {
        let x = x.get(o..o + c.len()).unwrap_or_default();
        rows(isa, c, x, row)
    })
}

/// PyTorch's `_safe_softmax` over the last dimension (a row of -inf only gives zeros),
/// fused from its exported decomposition (see `fuse.rs`): `(x, dim, out, out)`.
pub(super) struct SafeSoftmax;

impl Kernel for SafeSoftmax {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        match (f32_tensor(args, 0)?, f32_tensor(args, 2)?) {
            (Some(_), Some(_)) => Ok(Box::new(SafeSoftmax)),
            _ => Err(KernelError::invalid(
                "safe softmax: float32 tensors in the default dim order expected",
            )),
        }
    }
}

impl PreparedKernel for SafeSoftmax {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let x = args.info(0)?;
        if x.dim(args.int(1)?)? + 1 != x.rank() {
            return Err(KernelError::invalid(
                "safe softmax: only over the last dimension",
            ));
        }
        last_dim_rows(args, 2, elementwise::safe_softmax_rows)
    }
}

/// `native_layer_norm.out(input, normalized_shape, weight?, bias?, eps, out, mean, rstd)`.
struct LayerNorm;

pub(super) fn layer_norm(args: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    let optional =
        |i: usize| -> KernelResult<bool> { Ok(args.is_none(i)? || f32_tensor(args, i)?.is_some()) };
    let ok = f32_tensor(args, 0)?.is_some()
        && optional(2)?
        && optional(3)?
        && (5..8).all(|i| matches!(f32_tensor(args, i), Ok(Some(_))));
    Ok(ok.then(|| Box::new(LayerNorm) as Box<dyn PreparedKernel>))
}

impl PreparedKernel for LayerNorm {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let x = args.tensor(0)?;
        let shape = args.int_list(1)?;
        let axis = x
            .rank()
            .checked_sub(shape.len())
            .filter(|&a| {
                let tail = x.sizes.get(a..).unwrap_or_default();
                tail.iter()
                    .zip(&shape)
                    .all(|(&s, &n)| i64::try_from(s) == Ok(n))
            })
            .ok_or_else(|| {
                KernelError::invalid(format!(
                    "normalized shape {shape:?} does not end input shape {:?}",
                    x.sizes.as_slice()
                ))
            })?;
        let row: usize = x.sizes.get(axis..).unwrap_or_default().iter().product();
        let eps = args.double(4)? as f32;
        let mut stat: SmallVec<[usize; 6]> = x.sizes.get(..axis).unwrap_or_default().into();
        stat.extend(std::iter::repeat_n(1, shape.len()));
        for i in [2, 3] {
            if !args.is_none(i)? && args.info(i)?.numel() != row {
                return Err(KernelError::invalid(format!(
                    "layer norm: argument {i} must hold {row} values"
                )));
            }
        }
        args.resize(5, &x.sizes)?;
        args.resize(6, &stat)?;
        args.resize(7, &stat)?;
        let rows: usize = stat.iter().product();
        let mut reads: SmallVec<[Arg; 3]> = SmallVec::from_slice(&[at(0)]);
        let (wi, bi) = (!args.is_none(2)?, !args.is_none(3)?);
        if wi {
            reads.push(at(2));
        }
        if bi {
            reads.push(at(3));
        }
        let pool = args.pool();
        let mut io = args.io(&reads, &[at(5), at(6), at(7)])?;
        let missing = || KernelError::Failed("missing tensor view".into());
        let input = |i: usize| -> KernelResult<&[f32]> {
            io.inputs.get(i).ok_or_else(missing)?.as_slice::<f32>()
        };
        let src = input(0)?;
        let gamma = if wi { Some(input(1)?) } else { None };
        let beta = if bi {
            Some(input(1 + usize::from(wi))?)
        } else {
            None
        };
        let [out, mean, rstd] = io.outputs.as_mut_slice() else {
            return Err(missing());
        };
        let (out, mean, rstd) = (
            out.as_mut_slice::<f32>()?,
            mean.as_mut_slice::<f32>()?,
            rstd.as_mut_slice::<f32>()?,
        );
        let pairs = super::scratch(io.scratch, rows * 2)?;
        let isa = Isa::best();
        let affine = (gamma, beta);
        elementwise::layer_norm_rows_on(pool, isa, out, src, row, affine, eps, Some(pairs))
            .map_err(compute)?;
        for ((m, r), p) in mean
            .iter_mut()
            .zip(rstd.iter_mut())
            .zip(pairs.chunks_exact(2))
        {
            if let [pm, pr] = p {
                (*m, *r) = (*pm, *pr);
            }
        }
        Ok(())
    }
}

/// `mean.dim_out(self, dim, keepdim, dtype, out)` over trailing dimensions.
struct Mean {
    fallback: Box<dyn PreparedKernel>,
}

pub(super) fn mean(args: &Args<'_>, generic: &dyn Kernel) -> super::Prepared {
    let ok = f32_tensor(args, 0)?.is_some() && f32_tensor(args, 4)?.is_some() && args.is_none(3)?;
    if !ok {
        return Ok(None);
    }
    Ok(Some(Box::new(Mean {
        fallback: generic.prepare(args)?,
    })))
}

impl PreparedKernel for Mean {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let x = args.info(0)?;
        let dims: SmallVec<[usize; 8]> = if args.is_none(1)? {
            (0..x.rank()).collect()
        } else {
            let mut d = args
                .int_list(1)?
                .iter()
                .map(|&d| x.dim(d))
                .collect::<KernelResult<SmallVec<[usize; 8]>>>()?;
            d.sort_unstable();
            d
        };
        // Trailing dimensions only, each once, not all (a mean over nothing).
        let first = x.rank().saturating_sub(dims.len());
        let trailing = !dims.is_empty() && dims.iter().enumerate().all(|(i, &d)| d == first + i);
        let inner: usize = x.sizes.get(first..).unwrap_or_default().iter().product();
        if !trailing || inner == 0 || x.rank() == 0 {
            return self.fallback.run(args);
        }
        let keepdim = args.bool(2)?;
        let mut sizes: SmallVec<[usize; 6]> = x.sizes.get(..first).unwrap_or_default().into();
        if keepdim {
            sizes.extend(std::iter::repeat_n(1, dims.len()));
        }
        args.resize(4, &sizes)?;
        let mut io = args.io(&[at(0)], &[at(4)])?;
        let (x, y) = views(&io.inputs, &mut io.outputs)?;
        pooling::global_avg_pool(Isa::best(), x, inner, y).map_err(compute)
    }
}
