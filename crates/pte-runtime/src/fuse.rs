//! Fusing consecutive kernel calls at method load.
//!
//! A [`Fuser`] (given by the kernel registry) looks at a method's calls once, when it
//! loads, and proposes groups of consecutive calls that one kernel can do in one call:
//! a convolution with the batch normalization and activation after it, a matrix product
//! and its activation. The runtime checks each proposal before taking it — every value
//! the group computes and the fused call does not keep must be used by nothing else:
//! no other instruction, no method output, no view the exporter elided — so a fuser can
//! make a call faster but never change what a method computes.

use std::sync::Arc;

use smallvec::SmallVec;

pub use crate::alias::Alias;
use crate::args::TensorInfo;
use crate::dtype::DType;
use crate::fold::{call_outputs, Views};
use crate::memory::{Access, Memory, Storage};
use crate::method::Instr;
use crate::registry::{Kernel, KernelRegistry};
use crate::value::Slot;

/// Where a call sits: its chain and instruction index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId {
    pub chain: usize,
    pub instruction: usize,
}

/// One kernel call as a fuser sees it.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    pub id: CallId,
    /// The operator, e.g. `aten::convolution.out`.
    pub op: &'a str,
    /// Value indices of the arguments, as the program lists them.
    pub args: &'a [u32],
}

impl<'a> Call<'a> {
    /// The values the call writes, by the out-variant convention (see
    /// [`repeated_outputs`]).
    pub fn outputs(&self) -> &'a [u32] {
        repeated_outputs(self.args)
    }
}

/// An out-variant call lists its `k` out arguments last, then the same `k` values again
/// as its results: those values (the largest such `k`; none when nothing repeats).
pub(crate) fn repeated_outputs(args: &[u32]) -> &[u32] {
    let n = args.len();
    (1..=n / 2)
        .rev()
        .find(|&k| args.get(n - 2 * k..n - k) == args.get(n - k..))
        .and_then(|k| args.get(n - k..))
        .unwrap_or_default()
}

/// A method's calls and values as fusers see them at load.
pub struct Graph<'a> {
    calls: Vec<Call<'a>>,
    values: &'a [Slot],
    /// Instructions referring to each value (any kind of instruction).
    uses: Vec<u32>,
    io: &'a [u32],
    /// The views the exporter elided and the values they alias.
    viewed: &'a Views,
    /// The method's memory, where constants can be read (see [`Graph::scalar_constant`]).
    memory: Option<&'a Memory>,
}

impl<'a> Graph<'a> {
    /// The graph of a method's chains as they stand (folded calls are `Nop`s).
    pub(crate) fn new(
        chains: &[Vec<Instr>],
        call_args: &'a [u32],
        op_names: &'a [String],
        values: &'a [Slot],
        io: &'a [u32],
        viewed: &'a Views,
    ) -> Self {
        let mut uses = vec![0u32; values.len()];
        for instr in chains.iter().flatten() {
            let mut refs = referenced(instr, call_args, values);
            refs.sort_unstable();
            refs.dedup();
            for v in refs {
                if let Some(u) = uses.get_mut(v as usize) {
                    *u += 1;
                }
            }
        }
        let mut calls = Vec::new();
        for (c, chain) in chains.iter().enumerate() {
            for (i, instr) in chain.iter().enumerate() {
                if let Instr::Kernel { op, args, .. } = instr {
                    calls.push(Call {
                        id: CallId {
                            chain: c,
                            instruction: i,
                        },
                        op: op_names.get(*op as usize).map_or("?", String::as_str),
                        args: call_args
                            .get(args.start as usize..args.end as usize)
                            .unwrap_or_default(),
                    });
                }
            }
        }
        Graph {
            calls,
            values,
            uses,
            io,
            viewed,
            memory: None,
        }
    }

    /// The graph reading constants from `memory`.
    pub(crate) fn with_memory(self, memory: &'a Memory) -> Self {
        Graph {
            memory: Some(memory),
            ..self
        }
    }

    /// The number held by a constant tensor of one element (a real dtype), such as
    /// the 3 and 6 of a decomposed hardswish; `None` for any other value.
    pub fn scalar_constant(&self, v: u32) -> Option<f64> {
        let Some(Slot::Tensor(t)) = self.values.get(v as usize) else {
            return None;
        };
        if !self.is_constant(v) || t.numel() != 1 {
            return None;
        }
        let nbytes = t.info.dtype.size();
        let bytes = self
            .memory?
            .read(Access {
                storage: t.storage,
                nbytes,
            })
            .ok()?;
        Some(match (t.info.dtype, bytes) {
            (DType::F32, &[a, b, c, d]) => f64::from(f32::from_le_bytes([a, b, c, d])),
            (DType::I32, &[a, b, c, d]) => f64::from(i32::from_le_bytes([a, b, c, d])),
            (DType::F64, b) => f64::from_le_bytes(b.try_into().ok()?),
            (DType::I64, b) => i64::from_le_bytes(b.try_into().ok()?) as f64,
            _ => return None,
        })
    }

    /// The kernel calls, in program order (calls folded at load are left out).
    pub fn calls(&self) -> &[Call<'a>] {
        &self.calls
    }

    /// Metadata of a tensor value.
    pub fn tensor(&self, v: u32) -> Option<TensorInfo> {
        match self.values.get(v as usize)? {
            Slot::Tensor(t) => Some(TensorInfo {
                dtype: t.info.dtype,
                sizes: t.info.sizes.clone(),
                dim_order: t.info.dim_order.clone(),
            }),
            _ => None,
        }
    }

    /// True for a tensor whose bytes are the same at every execution (in the program,
    /// a data file, or computed at load).
    pub fn is_constant(&self, v: u32) -> bool {
        matches!(
            self.values.get(v as usize),
            Some(Slot::Tensor(t)) if matches!(
                t.storage,
                Storage::Program { .. } | Storage::External { .. } | Storage::Folded { .. }
            )
        )
    }

    /// An `Int` value.
    pub fn int(&self, v: u32) -> Option<i64> {
        match self.values.get(v as usize)? {
            Slot::Int(x) => Some(*x),
            _ => None,
        }
    }

    /// A `Double` (or `Int`) value.
    pub fn double(&self, v: u32) -> Option<f64> {
        match self.values.get(v as usize)? {
            Slot::Double(x) => Some(*x),
            Slot::Int(x) => Some(*x as f64),
            _ => None,
        }
    }

    /// A `Bool` value.
    pub fn bool(&self, v: u32) -> Option<bool> {
        match self.values.get(v as usize)? {
            Slot::Bool(x) => Some(*x),
            _ => None,
        }
    }

    /// A `String` value.
    pub fn string(&self, v: u32) -> Option<&str> {
        match self.values.get(v as usize)? {
            Slot::String(x) => Some(x),
            _ => None,
        }
    }

    /// An `IntList` value, its elements read from their values.
    pub fn int_list(&self, v: u32) -> Option<SmallVec<[i64; 8]>> {
        match self.values.get(v as usize)? {
            Slot::IntList(items) => items.iter().map(|&i| self.int(i)).collect(),
            _ => None,
        }
    }

    /// The values of a `TensorList`.
    pub fn tensor_list(&self, v: u32) -> Option<&[u32]> {
        match self.values.get(v as usize)? {
            Slot::TensorList(items) => Some(items),
            _ => None,
        }
    }

    /// True for a tensor whose shape cannot change between executions.
    pub fn is_static(&self, v: u32) -> bool {
        matches!(
            self.values.get(v as usize),
            Some(Slot::Tensor(t)) if t.dynamism == crate::value::Dynamism::Static
        )
    }

    /// True for a `None` value.
    pub fn is_none(&self, v: u32) -> bool {
        matches!(self.values.get(v as usize), Some(Slot::None))
    }

    /// True when another value shares this value's memory (a view the exporter elided
    /// reads it): such a value is read by more than [`Graph::uses`] counts.
    pub fn is_aliased(&self, v: u32) -> bool {
        self.viewed.is_viewed(v)
    }

    /// True when `view` is a view the exporter elided that reads `source`'s memory
    /// (same place; its shape may differ).
    pub fn is_view_of(&self, view: u32, source: u32) -> bool {
        self.viewed.of(source).any(|w| w == view)
    }

    /// The views the exporter elided that read `source`'s memory.
    pub fn views_of(&self, source: u32) -> impl Iterator<Item = u32> + '_ {
        self.viewed.of(source)
    }

    /// How many instructions refer to a value (a value that is a method input or output
    /// counts one more).
    pub fn uses(&self, v: u32) -> u32 {
        let io = u32::from(self.io.contains(&v));
        self.uses.get(v as usize).copied().unwrap_or(0) + io
    }
}

/// A proposal: run `calls` (consecutive, in order) as one call of `kernel` with `args`.
pub struct Fusion {
    pub calls: Vec<CallId>,
    /// Shown in profiles and errors, e.g. `fused convolution+batch_norm+relu`.
    pub name: String,
    pub kernel: Arc<dyn Kernel>,
    pub args: Vec<u32>,
}

/// Proposes fusions for a method when it loads.
pub trait Fuser: Send + Sync {
    /// The groups of calls to fuse; the runtime takes those that are safe.
    fn fuse(&self, graph: &Graph<'_>) -> Vec<Fusion>;

    /// Calls whose output is a run of their input's elements in the same order (see
    /// [`Alias`]); the runtime elides those that are safe (see `alias.rs`). Asked after
    /// the fusions were taken.
    fn aliases(&self, _graph: &Graph<'_>) -> Vec<Alias> {
        Vec::new()
    }

    /// Calls that constant folding should leave to the fusions although their inputs
    /// are all constants: a call that a fusion reads through, such as the transpose of
    /// a weight that a product can read transposed while packing it. Asked before
    /// folding, on the method as the program has it; those the fusions do not take are
    /// folded after them, so the choice changes no result.
    fn defer_folding(&self, _graph: &Graph<'_>) -> Vec<CallId> {
        Vec::new()
    }
}

/// The calls the registry's fuser asks folding to leave to the fusions (see
/// [`Fuser::defer_folding`]), sorted.
pub(crate) fn deferred_folds(
    kernels: &KernelRegistry,
    chains: &[Vec<Instr>],
    call_args: &[u32],
    op_names: &[String],
    values: &[Slot],
    io: &[u32],
) -> Vec<CallId> {
    let Some(fuser) = kernels.fuser() else {
        return Vec::new();
    };
    // Elided views are not known yet; no deferral depends on them.
    let views = Views::default();
    let graph = Graph::new(chains, call_args, op_names, values, io, &views);
    let mut calls = fuser.defer_folding(&graph);
    calls.sort_unstable();
    calls.dedup();
    calls
}

/// Every value an instruction refers to, lists expanded.
pub(crate) fn referenced(instr: &Instr, call_args: &[u32], values: &[Slot]) -> SmallVec<[u32; 16]> {
    let args = |r: &std::ops::Range<u32>| {
        call_args
            .get(r.start as usize..r.end as usize)
            .unwrap_or_default()
    };
    let direct: SmallVec<[u32; 16]> = match instr {
        Instr::Kernel { args: r, .. } | Instr::Delegate { args: r, .. } => {
            SmallVec::from_slice(args(r))
        }
        Instr::Move { from, to } => SmallVec::from_slice(&[*from, *to]),
        Instr::JumpFalse { cond, .. } => SmallVec::from_slice(&[*cond]),
        Instr::Free { value } => SmallVec::from_slice(&[*value]),
        Instr::Nop => SmallVec::new(),
    };
    let mut all = direct.clone();
    for v in direct {
        match values.get(v as usize) {
            Some(Slot::IntList(items) | Slot::TensorList(items)) => all.extend_from_slice(items),
            Some(Slot::OptionalTensorList(items)) => all.extend(items.iter().flatten().copied()),
            _ => {}
        }
    }
    all
}

/// A fusion the runtime accepted: the call to keep (and run the fused kernel at), the
/// calls that become no-ops.
pub(crate) struct Accepted {
    pub first: CallId,
    pub rest: Vec<CallId>,
    pub name: String,
    pub kernel: Arc<dyn Kernel>,
    pub args: Vec<u32>,
}

/// Asks the registry's fuser for proposals and keeps the safe ones (see the module docs).
#[allow(clippy::too_many_arguments)] // the method's parts, as loading holds them
pub(crate) fn plan(
    kernels: &KernelRegistry,
    chains: &[Vec<Instr>],
    call_args: &[u32],
    op_names: &[String],
    values: &[Slot],
    io: &[u32],
    viewed: &Views,
    memory: &Memory,
) -> Vec<Accepted> {
    let Some(fuser) = kernels.fuser() else {
        return Vec::new();
    };
    let graph = Graph::new(chains, call_args, op_names, values, io, viewed).with_memory(memory);
    let jump_targets: Vec<(usize, usize)> = chains
        .iter()
        .enumerate()
        .flat_map(|(c, chain)| {
            chain.iter().filter_map(move |i| match i {
                Instr::JumpFalse { destination, .. } => Some((c, *destination)),
                _ => None,
            })
        })
        .collect();
    let cx = Context {
        chains,
        call_args,
        op_names,
        kernels,
        values,
        jump_targets,
        viewed,
    };
    let mut taken: Vec<CallId> = Vec::new();
    let mut accepted = Vec::new();
    for f in fuser.fuse(&graph) {
        if let Some(a) = check(&f, &cx, &graph)
            .filter(|a| !a.rest.iter().chain([&a.first]).any(|c| taken.contains(c)))
        {
            taken.push(a.first);
            taken.extend_from_slice(&a.rest);
            accepted.push(a);
        }
    }
    accepted
}

/// What the checks of one proposal need to know about the method.
struct Context<'a> {
    chains: &'a [Vec<Instr>],
    call_args: &'a [u32],
    op_names: &'a [String],
    kernels: &'a KernelRegistry,
    values: &'a [Slot],
    jump_targets: Vec<(usize, usize)>,
    viewed: &'a Views,
}

fn check(f: &Fusion, cx: &Context<'_>, graph: &Graph<'_>) -> Option<Accepted> {
    let Context {
        chains,
        call_args,
        op_names,
        kernels,
        values,
        ref jump_targets,
        viewed,
    } = *cx;
    let (&first, rest) = f.calls.split_first()?;
    let chain = chains.get(first.chain)?;
    // Consecutive calls of one chain (calls folded at load may sit between), no jump
    // into the middle.
    let mut at = first.instruction;
    for c in rest {
        if c.chain != first.chain || c.instruction <= at {
            return None;
        }
        let between = chain.get(at + 1..c.instruction)?;
        if !between.iter().all(|i| matches!(i, Instr::Nop)) {
            return None;
        }
        at = c.instruction;
    }
    let last = at;
    if jump_targets
        .iter()
        .any(|&(c, d)| c == first.chain && d > first.instruction && d <= last)
    {
        return None;
    }
    if f.args.iter().any(|&a| a as usize >= values.len()) {
        return None;
    }
    let group: Vec<&Instr> = f
        .calls
        .iter()
        .map(|c| chain.get(c.instruction))
        .collect::<Option<_>>()?;
    // Pure calls only, and what they write that the fused call does not keep must be
    // used by the group alone (what they only read may be left out freely).
    let mut written: Vec<u32> = Vec::new();
    for i in &group {
        let Instr::Kernel { op, args, .. } = i else {
            return None;
        };
        let name = op_names.get(*op as usize)?;
        if !kernels.is_pure(name) {
            return None;
        }
        let args = call_args.get(args.start as usize..args.end as usize)?;
        written.extend(call_outputs(args, values)?);
    }
    // A value no longer computed may have elided views: they, too, must be read by
    // the group alone. (Instructions of the group referring to each value, counted once
    // for the whole group: a region fuses hundreds of calls.)
    let mut group_uses: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for i in &group {
        let mut refs = referenced(i, call_args, values);
        refs.sort_unstable();
        refs.dedup();
        for v in refs {
            *group_uses.entry(v).or_default() += 1;
        }
    }
    let only_group_reads = |v: u32| graph.uses(v) == group_uses.get(&v).copied().unwrap_or(0);
    for v in written {
        if f.args.contains(&v) {
            continue;
        }
        if !only_group_reads(v)
            || !viewed
                .of(v)
                .all(|w| !f.args.contains(&w) && only_group_reads(w))
        {
            return None;
        }
    }
    Some(Accepted {
        first,
        rest: rest.to_vec(),
        name: f.name.clone(),
        kernel: f.kernel.clone(),
        args: f.args.clone(),
    })
}
