//! Chains of elementwise float32 calls on tensors of one size, run as one call.
//!
//! An exported LSTM computes each time step's gates as ten calls on 128 values:
//! `split_with_sizes_copy` into four, `sigmoid` / `tanh` of each, then the cell's
//! `mul`, `mul`, `add`, `tanh`, `mul`. Dispatching a call costs more than its
//! arithmetic there. The fused call evaluates the chain [`BLOCK`] values at a time in
//! the method's scratch memory, with the vector functions the calls use one by one
//! (`elementwise::map` and `elementwise::binary`), so its results are the same bits.
//!
//! A chain takes consecutive calls of `split_with_sizes_copy` (along a dim with only
//! ones before it, pieces of the chain's size: each piece is a run of the input),
//! `sigmoid`, `tanh`, `relu`, and `add` / `sub` (alpha 1) / `mul` of two tensors of the
//! chain's size; every tensor float32, static, in the default dim order. The values it
//! computes that anything after it reads are its outputs.
//!
//! A chain may also follow the matrix product it reads (see [`after_product`]): an
//! LSTM step's two calls, the product and its gates, become one. On the benchmarks'
//! 2-layer LSTM (32 steps each), one thread: 0.81x the time of the two calls.

use std::sync::Arc;

use pte_compute::elementwise::{self, Activation, BinaryOp};
use pte_compute::Isa;
use pte_runtime::{
    Arg, Args, Call, CallId, Fusion, Graph, Io, Kernel, KernelError, KernelResult, PreparedKernel,
};
use smallvec::SmallVec;

use super::fuse::{arg, is_f32, single_output};
use super::linear::{self, Op};
use super::{at, compute, f32_tensor, scratch};

/// Values of each step evaluated at once: a block's temporaries stay in L1.
const BLOCK: usize = 256;
/// Calls in a chain: at least (fewer save too little), at most.
const MIN_CALLS: usize = 3;
const MAX_CALLS: usize = 32;
/// Tensors a chain reads and writes at most (its views then need no heap memory).
const MAX_INPUTS: usize = 8;
const MAX_OUTPUTS: usize = 4;
/// Values per tensor above which the calls stay separate (each then splits its loop
/// over the threads).
const MAX_VALUES: usize = 1 << 12;

/// Where a step reads its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// Values from `offset` on of input `k` of the fused call.
    Input { k: usize, offset: usize },
    /// The result of step `s`.
    Step(usize),
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Unary(Activation, Operand),
    Binary(BinaryOp, Operand, Operand),
}

/// A chain as the fused call runs it.
#[derive(Debug)]
struct Chain {
    /// Values of every step and output.
    len: usize,
    /// Values of each input.
    input_lens: Vec<usize>,
    steps: Vec<Step>,
    /// What each output holds.
    outputs: Vec<Operand>,
}

/// A chain matched on some calls: what it computes, the values it reads (its inputs,
/// in order) and those it writes.
struct Matched {
    chain: Chain,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    calls: Vec<CallId>,
}

/// The longest chain of at least [`MIN_CALLS`] calls starting at `calls[0]`, if any.
pub(super) fn propose(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Fusion> {
    let m = longest(calls, MIN_CALLS, |group| chain(g, group))?;
    let mut args = m.inputs;
    args.extend(&m.outputs);
    args.extend(&m.outputs);
    Some(Fusion {
        calls: m.calls,
        name: "fused elementwise chain".into(),
        kernel: Arc::new(ChainKernel(Arc::new(m.chain))),
        args,
    })
}

/// The longest group of at least `min` calls from `calls[0]` that `matches`.
fn longest<T>(
    calls: &[Call<'_>],
    min: usize,
    matches: impl Fn(&[Call<'_>]) -> Option<T>,
) -> Option<T> {
    let supported = calls
        .iter()
        .take(MAX_CALLS)
        .take_while(|c| kind(c.op).is_some())
        .count();
    (min..=supported)
        .rev()
        .find_map(|n| calls.get(..n).and_then(&matches))
}

/// A matrix product with a constant weight as a fused call sees it: the calls it
/// spans, its arguments (its output left out), and the value it computes.
pub(super) struct ProductCalls {
    pub ids: Vec<CallId>,
    pub args: Vec<u32>,
    pub op: Op,
    pub transposed: bool,
    pub out: u32,
    pub name: String,
}

/// The product `p` and the longest chain at the start of `calls` that reads its output
/// (or views the exporter elided of it, all of its elements) as one call: the product
/// goes to scratch memory, where the chain reads it, instead of the method's memory.
/// An LSTM step is the product of the hidden state and the recurrent weight, then its
/// gates' chain. The runtime takes the fusion only if nothing else reads the product.
pub(super) fn after_product(g: &Graph<'_>, calls: &[Call<'_>], p: ProductCalls) -> Option<Fusion> {
    let numel = |v: u32| g.tensor(v).map(|t| t.numel());
    let len = numel(p.out)?;
    let of_product = |v: u32| v == p.out || (g.is_view_of(v, p.out) && numel(v) == Some(len));
    // Nothing but the chain may read the product (the runtime would refuse the whole
    // fusion, and the product would lose its own).
    let only_chain_reads = |group: &[Call<'_>]| {
        let reads = |w: u32| group.iter().filter(|c| c.args.contains(&w)).count();
        g.uses(p.out) == 1 && g.views_of(p.out).all(|w| g.uses(w) as usize == reads(w))
    };
    let m = longest(calls, 1, |group| {
        chain(g, group)
            .filter(|m| m.inputs.iter().any(|&v| of_product(v)) && only_chain_reads(group))
    })?;
    let sources: Vec<Source> = m
        .inputs
        .iter()
        .scan(0, |next, &v| {
            Some(if of_product(v) {
                Source::Product
            } else {
                *next += 1;
                Source::Arg(*next - 1)
            })
        })
        .collect();
    let mut args = p.args;
    args.extend(m.inputs.iter().filter(|&&v| !of_product(v)));
    args.extend(&m.outputs);
    args.extend(&m.outputs);
    let mut ids = p.ids;
    ids.extend(m.calls);
    Some(Fusion {
        calls: ids,
        name: format!("{}+elementwise chain", p.name),
        kernel: Arc::new(ProductChainKernel {
            op: p.op,
            transposed: p.transposed,
            chain: Arc::new(m.chain),
            sources,
        }),
        args,
    })
}

#[derive(Clone, Copy)]
enum Kind {
    Split,
    Unary(Activation),
    Binary(BinaryOp, bool),
}

/// What a call does in a chain (`true`: it has an alpha).
fn kind(op: &str) -> Option<Kind> {
    Some(match op {
        "aten::split_with_sizes_copy.out" => Kind::Split,
        "aten::sigmoid.out" => Kind::Unary(Activation::Sigmoid),
        "aten::tanh.out" => Kind::Unary(Activation::Tanh),
        "aten::relu.out" => Kind::Unary(Activation::RELU),
        "aten::add.out" => Kind::Binary(BinaryOp::Add, true),
        "aten::sub.out" => Kind::Binary(BinaryOp::Sub, true),
        "aten::mul.out" => Kind::Binary(BinaryOp::Mul, false),
        _ => return None,
    })
}

/// The chain of exactly `calls`, if they form one.
fn chain(g: &Graph<'_>, calls: &[Call<'_>]) -> Option<Matched> {
    let numel = |v: u32| g.tensor(v).map(|t| t.numel());
    let plain = |v: u32| is_f32(g, v) && g.is_static(v);
    // The chain's size: a piece's when it starts with a split (or with the binary call
    // whose result a split cuts), else the first result's.
    let piece = |c: &Call<'_>| numel(*g.tensor_list(arg(c, 3)?)?.first()?);
    let first = calls.first()?;
    let len = match (kind(first.op)?, calls.get(1)) {
        (Kind::Split, _) => piece(first)?,
        (Kind::Binary(..), Some(next))
            if matches!(kind(next.op), Some(Kind::Split))
                && arg(next, 0) == single_output(first) =>
        {
            piece(next)?
        }
        _ => numel(single_output(first)?)?,
    };
    if len == 0 || len > MAX_VALUES {
        return None;
    }
    let mut defined: Vec<(u32, Operand)> = Vec::new();
    let mut inputs: Vec<(u32, usize)> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    let mut lists: Vec<u32> = Vec::new();
    // Binary calls on several chain sizes of inputs whose result only a split reads:
    // (result, operation, operands). Each piece becomes the operation on runs of the
    // operands (an LSTM step adds its two products before cutting the gates).
    let mut wide: Vec<(u32, BinaryOp, Operand, Operand)> = Vec::new();
    let read = |v: u32, defined: &[(u32, Operand)], inputs: &mut Vec<(u32, usize)>| {
        if let Some(&(_, o)) = defined.iter().find(|(d, _)| *d == v) {
            return Some(o);
        }
        if !plain(v) || numel(v)? != len {
            return None;
        }
        Some(Operand::Input {
            k: input(inputs, v, len),
            offset: 0,
        })
    };
    for c in calls {
        match kind(c.op)? {
            Kind::Split => {
                let (x, list) = (arg(c, 0)?, arg(c, 3)?);
                let t = g.tensor(x)?;
                let dim =
                    usize::try_from(g.int(arg(c, 2)?)?.rem_euclid(t.rank().max(1) as i64)).ok()?;
                let pieces = g.tensor_list(list)?;
                let runs = t.sizes.get(..dim)?.iter().all(|&s| s == 1);
                let fits = pieces.iter().all(|&p| plain(p) && numel(p) == Some(len));
                let whole = pieces.len().checked_mul(len) == Some(t.numel());
                if !(runs && fits && whole && plain(x)) || defined.iter().any(|(d, _)| *d == x) {
                    return None;
                }
                let run = |o: Operand, j: usize| match o {
                    Operand::Input { k, offset } => Operand::Input {
                        k,
                        offset: offset + j * len,
                    },
                    Operand::Step(_) => o,
                };
                match wide.iter().find(|w| w.0 == x) {
                    Some(&(_, op, a, b)) => {
                        for (j, &p) in pieces.iter().enumerate() {
                            steps.push(Step::Binary(op, run(a, j), run(b, j)));
                            defined.push((p, Operand::Step(steps.len() - 1)));
                        }
                    }
                    None => {
                        let whole = Operand::Input {
                            k: input(&mut inputs, x, t.numel()),
                            offset: 0,
                        };
                        for (j, &p) in pieces.iter().enumerate() {
                            defined.push((p, run(whole, j)));
                        }
                    }
                }
                lists.push(list);
            }
            Kind::Unary(act) => {
                let out = single_output(c)?;
                let x = read(arg(c, 0)?, &defined, &mut inputs)?;
                if !plain(out) || numel(out)? != len {
                    return None;
                }
                steps.push(Step::Unary(act, x));
                defined.push((out, Operand::Step(steps.len() - 1)));
            }
            Kind::Binary(op, alpha) => {
                let out = single_output(c)?;
                if alpha && g.double(arg(c, 2)?) != Some(1.0) {
                    return None;
                }
                let (a, b) = (arg(c, 0)?, arg(c, 1)?);
                let n = numel(out)?;
                if n != len && n % len == 0 {
                    // Whole inputs of the result's size (no broadcast), not results of
                    // the chain.
                    let fresh = |v: u32| {
                        plain(v) && numel(v) == Some(n) && !defined.iter().any(|(d, _)| *d == v)
                    };
                    if !(plain(out) && fresh(a) && fresh(b)) {
                        return None;
                    }
                    let mut whole = |v: u32| Operand::Input {
                        k: input(&mut inputs, v, n),
                        offset: 0,
                    };
                    let (x, y) = (whole(a), whole(b));
                    wide.push((out, op, x, y));
                    continue;
                }
                let x = read(a, &defined, &mut inputs)?;
                let y = read(b, &defined, &mut inputs)?;
                if !plain(out) || n != len {
                    return None;
                }
                steps.push(Step::Binary(op, x, y));
                defined.push((out, Operand::Step(steps.len() - 1)));
            }
        }
    }
    // What the chain computes and anything else reads (a view of it too) is an output;
    // a split's list only the chain may read.
    let mut uses: Vec<(u32, u32)> = Vec::new();
    for c in calls {
        let mut refs: SmallVec<[u32; 16]> = SmallVec::from_slice(c.args);
        for &a in c.args {
            refs.extend_from_slice(g.tensor_list(a).unwrap_or_default());
        }
        refs.sort_unstable();
        refs.dedup();
        for v in refs {
            match uses.iter_mut().find(|(u, _)| *u == v) {
                Some((_, n)) => *n += 1,
                None => uses.push((v, 1)),
            }
        }
    }
    let outside = |v: u32| {
        let inside = uses.iter().find(|(u, _)| *u == v).map_or(0, |&(_, n)| n);
        g.uses(v) != inside || g.is_aliased(v)
    };
    if lists
        .iter()
        .chain(wide.iter().map(|w| &w.0))
        .any(|&l| outside(l))
    {
        return None;
    }
    let outputs: Vec<(u32, Operand)> = defined.into_iter().filter(|&(v, _)| outside(v)).collect();
    if outputs.is_empty() || outputs.len() > MAX_OUTPUTS || inputs.len() > MAX_INPUTS {
        return None;
    }
    Some(Matched {
        chain: Chain {
            len,
            input_lens: inputs.iter().map(|&(_, n)| n).collect(),
            steps,
            outputs: outputs.iter().map(|&(_, o)| o).collect(),
        },
        inputs: inputs.iter().map(|&(v, _)| v).collect(),
        outputs: outputs.iter().map(|&(v, _)| v).collect(),
        calls: calls.iter().map(|c| c.id).collect(),
    })
}

/// The index of input `v` (of `n` values), added if new.
fn input(inputs: &mut Vec<(u32, usize)>, v: u32, n: usize) -> usize {
    inputs.iter().position(|&(i, _)| i == v).unwrap_or_else(|| {
        inputs.push((v, n));
        inputs.len() - 1
    })
}

/// Values `b0..b0 + n` of an operand: of an input, or of a step's result in `done`
/// (the block's results so far, [`BLOCK`] values per step).
fn operand<'a>(
    o: Operand,
    ins: &[&'a [f32]],
    done: &'a [f32],
    b0: usize,
    n: usize,
) -> Option<&'a [f32]> {
    match o {
        Operand::Input { k, offset } => ins.get(k)?.get(offset + b0..offset + b0 + n),
        Operand::Step(s) => done.get(s * BLOCK..s * BLOCK + n),
    }
}

/// Checks that argument `at` is a float32 tensor of `n` values.
fn check_len(args: &Args<'_>, at: usize, n: usize) -> KernelResult {
    if f32_tensor(args, at)?.map(|t| t.numel()) != Some(n) {
        return Err(KernelError::invalid(format!(
            "{}: argument {at} is not a float32 tensor of {n} values",
            args.op()
        )));
    }
    Ok(())
}

struct ChainKernel(Arc<Chain>);

impl Kernel for ChainKernel {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        let chain = &self.0;
        let lens = chain
            .input_lens
            .iter()
            .chain(chain.outputs.iter().map(|_| &chain.len));
        for (i, &n) in lens.enumerate() {
            check_len(args, i, n)?;
        }
        Ok(Box::new(PreparedChain(Arc::clone(chain))))
    }
}

struct PreparedChain(Arc<Chain>);

impl PreparedKernel for PreparedChain {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let chain = &*self.0;
        let (ni, no) = (chain.input_lens.len(), chain.outputs.len());
        let reads: SmallVec<[Arg; MAX_INPUTS]> = (0..ni).map(at).collect();
        let writes: SmallVec<[Arg; MAX_OUTPUTS]> = (ni..ni + no).map(at).collect();
        let mut io = args.io(&reads, &writes)?;
        let (ins, mut outs, buf) = slices(&mut io)?;
        let temps = scratch(buf, chain.temps_len())?;
        chain.eval(&ins, &mut outs, temps)
    }
}

/// The float32 values of an `io` call's inputs and outputs, and its scratch memory.
#[allow(clippy::type_complexity)] // three plain borrows
fn slices<'a>(
    io: &'a mut Io<'_>,
) -> KernelResult<(
    SmallVec<[&'a [f32]; MAX_INPUTS]>,
    SmallVec<[&'a mut [f32]; MAX_OUTPUTS]>,
    &'a mut pte_runtime::Buffer,
)> {
    let ins = io
        .inputs
        .iter()
        .map(|t| t.as_slice::<f32>())
        .collect::<KernelResult<_>>()?;
    let outs = io
        .outputs
        .iter_mut()
        .map(|t| t.as_mut_slice::<f32>())
        .collect::<KernelResult<_>>()?;
    Ok((ins, outs, &mut *io.scratch))
}

impl Chain {
    /// Scratch floats [`Chain::eval`] needs.
    fn temps_len(&self) -> usize {
        self.steps.len() * BLOCK
    }

    /// Computes the outputs from the inputs, [`BLOCK`] values of every step at a time.
    fn eval(&self, ins: &[&[f32]], outs: &mut [&mut [f32]], temps: &mut [f32]) -> KernelResult {
        let isa = Isa::best();
        let missing = || KernelError::Failed("an elementwise chain's operand is missing".into());
        for b0 in (0..self.len).step_by(BLOCK) {
            let n = BLOCK.min(self.len - b0);
            for (s, step) in self.steps.iter().enumerate() {
                let (done, rest) = temps.split_at_mut(s * BLOCK);
                let dst = rest.get_mut(..n).ok_or_else(missing)?;
                let done: &[f32] = done;
                match *step {
                    Step::Unary(act, x) => elementwise::map(
                        isa,
                        dst,
                        operand(x, ins, done, b0, n).ok_or_else(missing)?,
                        act,
                    ),
                    Step::Binary(op, x, y) => elementwise::binary(
                        isa,
                        dst,
                        operand(x, ins, done, b0, n).ok_or_else(missing)?,
                        operand(y, ins, done, b0, n).ok_or_else(missing)?,
                        op,
                        Activation::Identity,
                    ),
                }
                .map_err(compute)?;
            }
            for (out, &o) in outs.iter_mut().zip(&self.outputs) {
                let src = operand(o, ins, temps, b0, n).ok_or_else(missing)?;
                out.get_mut(b0..b0 + n)
                    .ok_or_else(missing)?
                    .copy_from_slice(src);
            }
        }
        Ok(())
    }
}

/// Where a chain after a product finds an input.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The product's values.
    Product,
    /// The fused call's `j`-th argument after the product's own.
    Arg(usize),
}

/// A product with a constant weight and the chain after it (see [`after_product`]):
/// the product's arguments, the chain's other inputs, its outputs.
struct ProductChainKernel {
    op: Op,
    transposed: bool,
    chain: Arc<Chain>,
    /// One per input of the chain.
    sources: Vec<Source>,
}

impl Kernel for ProductChainKernel {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        let product = linear::prepare_unstored(args, self.op, self.transposed)?;
        let len = product.len(args)?;
        let chain = &self.chain;
        let first = self.op.arguments();
        for (s, &n) in self.sources.iter().zip(&chain.input_lens) {
            match *s {
                Source::Product if n != len => {
                    return Err(KernelError::invalid(format!(
                        "{}: a product of {len} values read as {n}",
                        args.op()
                    )))
                }
                Source::Product => {}
                Source::Arg(j) => check_len(args, first + j, n)?,
            }
        }
        let reads = self
            .sources
            .iter()
            .filter(|s| matches!(s, Source::Arg(_)))
            .count();
        for o in 0..chain.outputs.len() {
            check_len(args, first + reads + o, chain.len)?;
        }
        Ok(Box::new(PreparedProductChain {
            product,
            len,
            chain: Arc::clone(chain),
            sources: self.sources.clone(),
            reads: std::iter::once(at(self.op.input()))
                .chain((0..reads).map(|j| at(first + j)))
                .collect(),
            writes: (0..chain.outputs.len())
                .map(|o| at(first + reads + o))
                .collect(),
        }))
    }
}

struct PreparedProductChain {
    product: linear::Unstored,
    /// Values of the product.
    len: usize,
    chain: Arc<Chain>,
    sources: Vec<Source>,
    /// The product's left operand, then the chain's other inputs; the chain's outputs.
    reads: SmallVec<[Arg; MAX_INPUTS]>,
    writes: SmallVec<[Arg; MAX_OUTPUTS]>,
}

impl PreparedKernel for PreparedProductChain {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let len = self.product.len(args)?;
        if len != self.len {
            return Err(KernelError::invalid(format!(
                "{}: a product of {len} values where the chain reads {}",
                args.op(),
                self.len
            )));
        }
        let pool = args.pool();
        let product_scratch = self.product.scratch_len(len, pool.threads())?;
        let mut io = args.io(&self.reads, &self.writes)?;
        let (ins, mut outs, buf) = slices(&mut io)?;
        let s = scratch(buf, len + product_scratch + self.chain.temps_len())?;
        let (y, rest) = s.split_at_mut(len);
        let (product_scratch, temps) = rest.split_at_mut(product_scratch);
        let (x, others) = ins
            .split_first()
            .ok_or_else(|| KernelError::Failed("a fused product's input is missing".into()))?;
        self.product.multiply(pool, x, y, product_scratch)?;
        let y: &[f32] = y;
        let chain_ins: SmallVec<[&[f32]; MAX_INPUTS]> = self
            .sources
            .iter()
            .map(|s| match *s {
                Source::Product => y,
                Source::Arg(j) => others.get(j).copied().unwrap_or_default(),
            })
            .collect();
        self.chain.eval(&chain_ins, &mut outs, temps)
    }

    fn consumed(&self) -> &[usize] {
        self.product.consumed()
    }
}
