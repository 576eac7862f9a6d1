//! Matrix products on `pte_compute::Gemm`: `addmm`, `linear` and `mm` with a constant
//! right operand (a weight) packed once at load (or, when larger than a last-level
//! cache, read where it lies in the file), the bias and an activation fused into the
//! product's epilogue; `mm` of two variable operands and `bmm` (attention) packed per
//! call into the method's scratch memory.

use pte_compute::gemm::IN_PLACE_WEIGHT_BYTES;
use pte_compute::{Activation, BatchMut, BatchRef, Bias, Epilogue, Gemm, Lhs, MatMut, MatRef};
use pte_compute::{PackedB, Rhs};
use pte_runtime::{
    Args, Charge, Kernel, KernelError, KernelResult, PreparedKernel, Scalar, SharedBytes,
};
use smallvec::SmallVec;
use std::sync::Arc;

use super::conv::Act;
use super::{at, charge, compute, constant_f32, f32_tensor, scratch, settle, views};

/// Which operator a [`Packed`] call site runs, and where its arguments are.
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    /// `addmm(bias, x, w, beta, alpha)`.
    Addmm,
    /// `linear(x, w, bias?)`: `w` is `[n, k]`, read transposed.
    Linear,
    /// `mm(x, w)`.
    Mm,
    /// `x · w` for every matrix of `x` (`[.., m, k]`), `w` (`[k, n]`, or with leading
    /// ones) the same for all: `bmm` of an operand broadcast over the batch, one
    /// product of all the rows at once.
    Broadcast,
}

impl Op {
    /// Position of the left operand.
    pub(super) fn input(self) -> usize {
        self.positions().0
    }

    /// Position of the weight.
    pub(super) fn weight(self) -> usize {
        self.positions().1
    }

    /// Arguments of the plain call before its output.
    pub(super) fn arguments(self) -> usize {
        self.positions().2
    }

    /// Positions of the left operand, the weight, and the output (of the plain call).
    fn positions(self) -> (usize, usize, usize) {
        match self {
            Op::Addmm => (1, 2, 5),
            Op::Linear => (0, 1, 3),
            Op::Mm | Op::Broadcast => (0, 1, 2),
        }
    }
}

/// A constant right operand.
enum Weight {
    /// Packed at load into the layout the micro-kernel reads.
    Packed(PackedB),
    /// Read where it lies in the program or data file, `n` rows of `k` values (the
    /// operand transposed).
    InPlace {
        bytes: SharedBytes,
        k: usize,
        n: usize,
    },
}

impl Weight {
    /// `(k, n)`: the operand is `k × n`.
    fn dims(&self) -> (usize, usize) {
        match self {
            Weight::Packed(b) => (b.rows(), b.cols()),
            Weight::InPlace { k, n, .. } => (*k, *n),
        }
    }

    fn rhs(&self) -> KernelResult<Rhs<'_>> {
        Ok(match self {
            Weight::Packed(b) => Rhs::Packed(b),
            Weight::InPlace { bytes, k, n } => {
                let values = bytemuck::try_cast_slice(bytes)
                    .map_err(|e| KernelError::Failed(format!("weight read in place: {e}")))?;
                Rhs::Mat(MatRef::row_major(values, *n, *k).map_err(compute)?.t())
            }
        })
    }
}

/// A constant right operand and the memory charged for it.
struct HeldWeight {
    weight: Weight,
    _charge: Charge,
}

/// A product with a constant right operand, prepared for a call site.
struct Product {
    op: Op,
    gemm: Gemm,
    b: Arc<HeldWeight>,
    /// One value per output column.
    bias: Option<Vec<f32>>,
    consumed: SmallVec<[usize; 2]>,
    _charge: Charge,
}

/// A product with a constant right operand written to its output tensor.
struct Packed {
    product: Product,
    act: Act,
    out: usize,
    /// The output has a shape of its own (an activation fused through a reshaping view):
    /// it keeps it, and must hold the product's elements.
    own_shape: bool,
}

pub(super) fn prepare_addmm(args: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    boxed(build(args, Op::Addmm, Act::None, 5, false))
}

pub(super) fn prepare_linear(args: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    boxed(build(args, Op::Linear, Act::None, 3, false))
}

pub(super) fn prepare_mm(args: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    match build(args, Op::Mm, Act::None, 2, false)? {
        Some(k) => Ok(Some(Box::new(k))),
        None => prepare_variable_mm(args),
    }
}

/// A fused product and activation: the product's arguments (its output dropped), then
/// the activation's scalars, then the output. `transposed`: the weight argument is
/// the transpose of the product's right operand (`[n, k]`).
pub(super) fn prepare_fused(
    args: &Args<'_>,
    op: Op,
    act: Act,
    out: usize,
    transposed: bool,
) -> KernelResult<Box<dyn PreparedKernel>> {
    match build(args, op, act, out, transposed)? {
        Some(k) => Ok(Box::new(k)),
        None => Err(KernelError::invalid(format!(
            "{}: arguments do not qualify for the fused product",
            args.op()
        ))),
    }
}

fn boxed(k: KernelResult<Option<Packed>>) -> KernelResult<Option<Box<dyn PreparedKernel>>> {
    Ok(k?.map(|k| Box::new(k) as Box<dyn PreparedKernel>))
}

/// `(rows, cols)` of a 2-d tensor.
fn matrix(sizes: &[usize]) -> Option<(usize, usize)> {
    match sizes {
        &[r, c] => Some((r, c)),
        _ => None,
    }
}

/// `(rows, cols)` of a tensor that is one matrix: 2-d, or with leading ones.
fn one_matrix(sizes: &[usize]) -> Option<(usize, usize)> {
    let lead = sizes.len().checked_sub(2)?;
    let (ones, last) = sizes.split_at(lead);
    ones.iter().all(|&d| d == 1).then_some(())?;
    matrix(last)
}

/// The product of a call site written to argument `out` with activation `act`.
fn build(
    args: &Args<'_>,
    op: Op,
    act: Act,
    out: usize,
    transposed: bool,
) -> KernelResult<Option<Packed>> {
    let (Some(x), Some(y)) = (f32_tensor(args, op.input())?, f32_tensor(args, out)?) else {
        return Ok(None);
    };
    let Some(product) = product(args, op, transposed)? else {
        return Ok(None);
    };
    let (k, n) = product.b.weight.dims();
    let natural = y.sizes.split_last().is_some_and(|(&last, lead)| {
        last == n
            && lead
                == x.sizes
                    .get(..x.rank().saturating_sub(1))
                    .unwrap_or_default()
    });
    let own_shape = !natural;
    if own_shape && y.numel() != x.numel() / k.max(1) * n {
        return Ok(None);
    }
    // Validate the activation's scalars now, so that a bad one fails at load.
    act.resolve(args)?;
    Ok(Some(Packed {
        product,
        act,
        out,
        own_shape,
    }))
}

/// The product of a call site, its weight packed (or shared with another call site
/// that packed it the same way), if the arguments qualify.
fn product(args: &Args<'_>, op: Op, transposed: bool) -> KernelResult<Option<Product>> {
    let (xi, wi, _) = op.positions();
    let (Some(x), Some(w)) = (f32_tensor(args, xi)?, f32_tensor(args, wi)?) else {
        return Ok(None);
    };
    let shape = match op {
        Op::Broadcast => one_matrix(&w.sizes),
        _ => matrix(&w.sizes),
    };
    let (Some(weights), Some((wr, wc))) = (constant_f32(args, wi)?, shape) else {
        return Ok(None);
    };
    // The weight as a k × n matrix (`linear` stores it n × k, as does a transposed one).
    let (k, n, w_view) = if transposed || matches!(op, Op::Linear) {
        (wc, wr, MatRef::row_major(weights, wr, wc).map(MatRef::t))
    } else {
        (wr, wc, MatRef::row_major(weights, wr, wc))
    };
    let Ok(w_view) = w_view else {
        return Ok(None);
    };
    let x_ok = match op {
        Op::Linear => x.sizes.last() == Some(&k),
        Op::Broadcast => x.rank() >= 2 && x.sizes.last() == Some(&k),
        Op::Addmm | Op::Mm => matrix(&x.sizes).is_some_and(|(_, c)| c == k),
    };
    if !x_ok {
        return Ok(None);
    }
    let mut consumed: SmallVec<[usize; 2]> = SmallVec::from_slice(&[wi]);
    let bias = match op {
        Op::Mm | Op::Broadcast => None,
        Op::Linear if args.is_none(2)? => None,
        Op::Linear => match (f32_tensor(args, 2)?, constant_f32(args, 2)?) {
            (Some(t), Some(b)) if t.rank() == 1 && b.len() == n => {
                consumed.push(2);
                Some(b.to_vec())
            }
            _ => return Ok(None),
        },
        Op::Addmm => {
            // beta·self + alpha·(x·w): alpha must be 1; self a row of n (or [1, n]).
            let (beta, alpha) = (args.scalar(3)?, args.scalar(4)?);
            if !matches!(alpha, Scalar::Int(1)) && alpha.to_f64() != 1.0 {
                return Ok(None);
            }
            let beta = beta.to_f64();
            if beta == 0.0 {
                None
            } else {
                match (f32_tensor(args, 0)?, constant_f32(args, 0)?) {
                    (Some(t), Some(b))
                        if b.len() == n && matches!(t.sizes.as_slice(), [_] | [1, _]) =>
                    {
                        consumed.push(0);
                        Some(b.iter().map(|&v| (beta * f64::from(v)) as f32).collect())
                    }
                    _ => return Ok(None),
                }
            }
        }
    };
    let gemm = Gemm::new();
    let stored_transposed = transposed || matches!(op, Op::Linear);
    let shared = match args.shared_constant(wi)? {
        Some(bytes) if stored_transposed && bytes.len() >= IN_PLACE_WEIGHT_BYTES => {
            // Only where the file's bytes can be read as f32 (they are aligned).
            bytemuck::try_cast_slice::<u8, f32>(&bytes)
                .is_ok()
                .then_some(bytes)
        }
        _ => None,
    };
    // One packed copy serves every call of the method that reads this weight the same
    // way (an unrolled recurrent network reads it at every step).
    let variant = (k as u64) << 1 | u64::from(stored_transposed);
    let b = args.derived(wi, "packed product weight", variant, || {
        // Packing holds the stored weight and its packed copy at once.
        let packing = if shared.is_some() { 0 } else { k * n + 64 };
        let mut held = charge(args, packing * 4 * 2, "packed weights")?;
        let weight = match shared {
            Some(bytes) => Weight::InPlace { bytes, k, n },
            // Stored n × k: packed a slab at a time, the file's pages of each slab given
            // back once it is.
            None if stored_transposed => Weight::Packed(
                gemm.pack_bt_on(args.pool(), weights, n, k, &mut |part| {
                    args.release_part(wi, bytemuck::cast_slice(part))
                })
                .map_err(compute)?,
            ),
            None => Weight::Packed(gemm.pack_b_on(args.pool(), w_view).map_err(compute)?),
        };
        let packed_bytes = match &weight {
            Weight::Packed(b) => b.bytes(),
            Weight::InPlace { .. } => 0,
        };
        settle(args, &mut held, packed_bytes)?;
        Ok(HeldWeight {
            weight,
            _charge: held,
        })
    })?;
    // The copied constants' file pages; a weight read in place keeps its own.
    let in_place = matches!(b.weight, Weight::InPlace { .. });
    for &i in consumed.iter().filter(|&&i| !(in_place && i == wi)) {
        args.release_pages(i);
    }
    let held = charge(
        args,
        bias.as_ref().map_or(0, |v| v.len() * 4),
        "product bias",
    )?;
    Ok(Some(Product {
        op,
        gemm,
        b,
        bias,
        consumed,
        _charge: held,
    }))
}

impl Product {
    /// Rows of the product for the call's left operand: its shape checked against the
    /// weight.
    fn rows(&self, args: &Args<'_>) -> KernelResult<usize> {
        let x = args.info(self.op.input())?;
        let (k, n) = self.b.weight.dims();
        let m = match self.op {
            Op::Linear | Op::Broadcast if x.sizes.last() == Some(&k) => x.numel() / k.max(1),
            Op::Addmm | Op::Mm => match matrix(&x.sizes) {
                Some((m, c)) if c == k => m,
                _ => 0,
            },
            Op::Linear | Op::Broadcast => 0,
        };
        if m * k != x.numel() || (m == 0 && x.numel() != 0) {
            return Err(KernelError::invalid(format!(
                "{}: input of shape {:?} does not fit the {k}x{n} weight",
                args.op(),
                x.sizes.as_slice()
            )));
        }
        Ok(m)
    }

    /// Columns of the product.
    fn cols(&self) -> usize {
        self.b.weight.dims().1
    }

    /// Scratch floats [`Packed::multiply`] needs for `m` rows.
    fn scratch_len(&self, m: usize, threads: usize) -> KernelResult<usize> {
        let (k, n) = self.b.weight.dims();
        let packed = matches!(self.b.weight, Weight::Packed(_));
        self.gemm
            .scratch_len(m, n, k, false, packed, threads)
            .map_err(compute)
    }

    /// `y = x · w` (`m` rows) with the bias and `activation` in the epilogue.
    fn multiply(
        &self,
        pool: &pte_compute::ThreadPool,
        x: &[f32],
        m: usize,
        y: &mut [f32],
        activation: Activation,
        scratch: &mut [f32],
    ) -> KernelResult {
        let (k, n) = self.b.weight.dims();
        let epilogue = Epilogue {
            accumulate: false,
            bias: self.bias.as_deref().map_or(Bias::None, Bias::Col),
            activation,
        };
        let c = MatMut::row_major(y, m, n).map_err(compute)?;
        let a = MatRef::row_major(x, m, k).map_err(compute)?;
        self.gemm
            .run(
                pool,
                c,
                Lhs::Mat(a),
                self.b.weight.rhs()?,
                &epilogue,
                scratch,
            )
            .map_err(compute)
    }
}

impl PreparedKernel for Packed {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let p = &self.product;
        let xi = p.op.input();
        let m = p.rows(args)?;
        let n = p.cols();
        if self.own_shape {
            let held = args.info(self.out)?.numel();
            if held != m * n {
                return Err(KernelError::invalid(format!(
                    "{}: output of {held} elements for a {m}x{n} product",
                    args.op()
                )));
            }
        } else {
            let mut sizes = args.info(xi)?.sizes.clone();
            if let Some(last) = sizes.last_mut() {
                *last = n;
            }
            args.resize(self.out, &sizes)?;
        }
        let activation = self.act.resolve(args)?;
        let pool = args.pool();
        let len = p.scratch_len(m, pool.threads())?;
        let mut io = args.io(&[at(xi)], &[at(self.out)])?;
        let (x, y) = views(&io.inputs, &mut io.outputs)?;
        let s = scratch(io.scratch, len)?;
        p.multiply(pool, x, m, y, activation, s)
    }

    fn consumed(&self) -> &[usize] {
        &self.product.consumed
    }
}

/// A product whose output only the elementwise chain fused after it reads
/// (`pointwise.rs`): it is written to scratch memory, never to the method's.
pub(super) struct Unstored(Product);

/// The product of a fused call whose arguments start with the product's own (its
/// output left out), without an activation.
pub(super) fn prepare_unstored(
    args: &Args<'_>,
    op: Op,
    transposed: bool,
) -> KernelResult<Unstored> {
    match product(args, op, transposed)? {
        Some(p) => Ok(Unstored(p)),
        None => Err(KernelError::invalid(format!(
            "{}: arguments do not qualify for the fused product",
            args.op()
        ))),
    }
}

impl Unstored {
    /// Values of the product for the call's left operand.
    pub(super) fn len(&self, args: &Args<'_>) -> KernelResult<usize> {
        Ok(self.0.rows(args)? * self.0.cols())
    }

    /// Scratch floats [`Unstored::multiply`] needs besides the product's values.
    pub(super) fn scratch_len(&self, len: usize, threads: usize) -> KernelResult<usize> {
        self.0.scratch_len(len / self.0.cols().max(1), threads)
    }

    /// The product of `x` into `y` (its [`Unstored::len`] values).
    pub(super) fn multiply(
        &self,
        pool: &pte_compute::ThreadPool,
        x: &[f32],
        y: &mut [f32],
        scratch: &mut [f32],
    ) -> KernelResult {
        let m = y.len() / self.0.cols().max(1);
        self.0
            .multiply(pool, x, m, y, Activation::Identity, scratch)
    }

    /// See [`PreparedKernel::consumed`].
    pub(super) fn consumed(&self) -> &[usize] {
        &self.0.consumed
    }
}

/// `mm` or `bmm` of two variable float32 operands, both packed per call.
struct Variable {
    gemm: Gemm,
    /// Position of the output.
    out: usize,
    batched: bool,
}

fn prepare_variable_mm(args: &Args<'_>) -> KernelResult<Option<Box<dyn PreparedKernel>>> {
    variable(args, false, 2)
}

pub(super) fn prepare_bmm(args: &Args<'_>, _: &dyn Kernel) -> super::Prepared {
    variable(args, true, 2)
}

fn variable(
    args: &Args<'_>,
    batched: bool,
    out: usize,
) -> KernelResult<Option<Box<dyn PreparedKernel>>> {
    let rank = if batched { 3 } else { 2 };
    let ok = [0, 1, out]
        .into_iter()
        .map(|i| f32_tensor(args, i).map(|t| t.is_some_and(|t| t.rank() == rank)))
        .collect::<KernelResult<Vec<bool>>>()?;
    if ok.contains(&false) {
        return Ok(None);
    }
    Ok(Some(Box::new(Variable {
        gemm: Gemm::new(),
        out,
        batched,
    })))
}

impl PreparedKernel for Variable {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let (a, b) = (args.info(0)?, args.info(1)?);
        let (count, m, k, n) = match (a.sizes.as_slice(), b.sizes.as_slice()) {
            (&[m, k], &[k2, n]) if !self.batched && k == k2 => (1, m, k, n),
            (&[ba, m, k], &[bb, k2, n]) if self.batched && ba == bb && k == k2 => (ba, m, k, n),
            (sa, sb) => {
                return Err(KernelError::invalid(format!(
                    "{}: shapes {sa:?} and {sb:?} cannot be multiplied",
                    args.op()
                )))
            }
        };
        let sizes: SmallVec<[usize; 3]> = if self.batched {
            SmallVec::from_slice(&[count, m, n])
        } else {
            SmallVec::from_slice(&[m, n])
        };
        args.resize(self.out, &sizes)?;
        let pool = args.pool();
        let mut io = args.io(&[at(0), at(1)], &[at(self.out)])?;
        let missing = || KernelError::Failed("missing tensor view".into());
        let x = io.inputs.first().ok_or_else(missing)?.as_slice::<f32>()?;
        let w = io.inputs.get(1).ok_or_else(missing)?.as_slice::<f32>()?;
        let y = io
            .outputs
            .first_mut()
            .ok_or_else(missing)?
            .as_mut_slice::<f32>()?;
        let len = self
            .gemm
            .batched_scratch_len(m, n, k, pool.threads())
            .map_err(compute)?;
        let s = scratch(io.scratch, len)?;
        let epilogue = Epilogue {
            accumulate: false,
            bias: Bias::None,
            activation: Activation::Identity,
        };
        let c = BatchMut::new(y, count, m, n, n, 1, m * n).map_err(compute)?;
        let a = BatchRef::new(x, count, m, k, k, 1, m * k).map_err(compute)?;
        let b = BatchRef::new(w, count, k, n, n, 1, k * n).map_err(compute)?;
        self.gemm
            .run_batched(pool, c, a, b, &epilogue, s)
            .map_err(compute)
    }
}
