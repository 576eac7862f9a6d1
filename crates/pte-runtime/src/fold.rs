//! Constant folding at method load: a call of a pure kernel whose inputs are all constants
//! runs once, when the method loads; its outputs become constants of the method, held in
//! runtime buffers charged to the budget, and the call is not executed again. This is how
//! the transposes the exporter inserts before every `addmm` on a weight, or the causal
//! masks of attention, stop costing time at each execution, and why kernels preparing a
//! call (packing weights) see those results as constants. Calls the registry's fuser
//! asks to defer ([`crate::Fuser::defer_folding`]: a weight's transpose that its product
//! can read while packing) wait for the fusions, and fold after them if none took them.
//!
//! Which arguments of a call are its outputs follows the ExecuTorch calling convention:
//! a trailing tensor list (several outputs) with the output tensors before it, or the out
//! tensor listed twice (one output), or a trailing scalar (prim ops).

use smallvec::SmallVec;

use crate::args::Args;
use crate::fuse::{referenced, CallId};
use crate::memory::{Memory, Storage};
use crate::method::Instr;
use crate::value::Slot;

/// The values a call writes, by the calling convention; `None` when it does not follow it.
pub(crate) fn call_outputs(args: &[u32], values: &[Slot]) -> Option<SmallVec<[u32; 4]>> {
    let (&last, rest) = args.split_last()?;
    match values.get(last as usize)? {
        Slot::TensorList(items) => {
            // The out list, then the same list again as the result (`split_with_sizes_copy`
            // as exported), or the list's tensors, then the list.
            if let Some(&out) = rest.last() {
                if matches!(values.get(out as usize), Some(Slot::TensorList(o)) if o == items) {
                    return Some(items.iter().copied().chain([out, last]).collect());
                }
            }
            let n = items.len();
            let outs = rest.get(rest.len().checked_sub(n)?..)?;
            (outs == &items[..]).then(|| outs.iter().copied().chain([last]).collect())
        }
        // Tensors only: a list among them would hide the tensors it writes.
        Slot::Tensor(_) => {
            let outs = crate::fuse::repeated_outputs(args);
            let tensors = outs
                .iter()
                .all(|&v| matches!(values.get(v as usize), Some(Slot::Tensor(_))));
            (!outs.is_empty() && tensors).then(|| SmallVec::from_slice(outs))
        }
        Slot::Int(_) | Slot::Double(_) | Slot::Bool(_) => Some(SmallVec::from_slice(&[last])),
        _ => None,
    }
}

/// How many instructions may write each value (see [`crate::alias::Method::written`]).
pub(crate) fn writes(
    chains: &[Vec<Instr>],
    m: &crate::alias::Method<'_>,
    values: &[Slot],
) -> Vec<u32> {
    let mut count = vec![0u32; values.len()];
    for instr in chains.iter().flatten() {
        for v in m.written(instr, values) {
            if let Some(c) = count.get_mut(v as usize) {
                *c = c.saturating_add(1);
            }
        }
    }
    count
}

/// True for a value that holds the same thing at every execution: constant tensors, and
/// scalars and lists that no instruction writes and the caller does not set.
fn is_constant(v: u32, values: &[Slot], writes: &[u32], io: &[u32]) -> bool {
    let unwritten = |x: u32| writes.get(x as usize) == Some(&0) && !io.contains(&x);
    match values.get(v as usize) {
        Some(Slot::Tensor(t)) => matches!(
            t.storage,
            Storage::Program { .. } | Storage::External { .. } | Storage::Folded { .. }
        ),
        Some(Slot::None | Slot::DoubleList(_) | Slot::BoolList(_)) => true,
        Some(Slot::Int(_) | Slot::Double(_) | Slot::Bool(_) | Slot::String(_)) => unwritten(v),
        Some(Slot::IntList(items)) => {
            unwritten(v) && items.iter().all(|&i| is_constant(i, values, writes, io))
        }
        Some(Slot::TensorList(items)) => {
            unwritten(v) && items.iter().all(|&i| is_constant(i, values, writes, io))
        }
        Some(Slot::OptionalTensorList(items)) => {
            unwritten(v)
                && items
                    .iter()
                    .flatten()
                    .all(|&i| is_constant(i, values, writes, io))
        }
        None => false,
    }
}

/// Elided views and the tensors they read there, which must keep their planned memory.
#[derive(Debug, Default)]
pub(crate) struct Views {
    /// `(source, view)`, sorted.
    pairs: Vec<(u32, u32)>,
}

impl Views {
    /// Records that `view` reads `source`'s memory.
    pub(crate) fn add(&mut self, source: u32, view: u32) {
        if let Err(at) = self.pairs.binary_search(&(source, view)) {
            self.pairs.insert(at, (source, view));
        }
    }

    /// Adds every pair of `other`.
    pub(crate) fn merge(&mut self, other: &Views) {
        for &(source, view) in &other.pairs {
            self.add(source, view);
        }
    }

    /// True when an elided view reads `v`'s memory.
    pub(crate) fn is_viewed(&self, v: u32) -> bool {
        self.of(v).next().is_some()
    }

    /// The tensor whose memory the elided view `view` reads, if any.
    pub(crate) fn source_of(&self, view: u32) -> Option<u32> {
        self.pairs
            .iter()
            .find(|&&(_, v)| v == view)
            .map(|&(s, _)| s)
    }

    /// The elided views that read `source`'s memory.
    pub(crate) fn of(&self, source: u32) -> impl Iterator<Item = u32> + '_ {
        let start = self.pairs.partition_point(|&(s, _)| s < source);
        self.pairs
            .get(start..)
            .unwrap_or_default()
            .iter()
            .take_while(move |&&(s, _)| s == source)
            .map(|&(_, v)| v)
    }
}

/// Which tensors elided views read.
///
/// The exporter plans a static `view_copy` at the very place of its input and emits no
/// instruction for it: such a view is a tensor that instructions read but none writes
/// (and the caller does not set). It sees what the last writer of its place put there
/// before its first read; that writer's output must stay in planned memory. With jumps
/// the order of writes is not known, so every tensor sharing a view's place stays.
pub(crate) fn viewed(
    chains: &[Vec<Instr>],
    call_args: &[u32],
    values: &[Slot],
    writes: &[u32],
    inputs: &[u32],
) -> Views {
    let place = |v: u32| match values.get(v as usize) {
        Some(Slot::Tensor(t)) => match t.storage {
            Storage::Planned { buffer, offset } => Some((buffer, offset)),
            _ => None,
        },
        _ => None,
    };
    let is_view =
        |v: u32| writes.get(v as usize) == Some(&0) && !inputs.contains(&v) && place(v).is_some();
    let jumps = chains
        .iter()
        .flatten()
        .any(|i| matches!(i, Instr::JumpFalse { .. }));
    // The tensors last written at each place (every writer, when jumps blur the order).
    let mut writers: std::collections::HashMap<(u32, usize), SmallVec<[u32; 2]>> =
        std::collections::HashMap::new();
    let mut pairs = Vec::new();
    for instr in chains.iter().flatten() {
        let args = referenced(instr, call_args, values);
        for &v in args.iter().filter(|&&v| is_view(v)) {
            if let Some(w) = place(v).and_then(|at| writers.get(&at)) {
                pairs.extend(w.iter().filter(|&&o| o != v).map(|&o| (o, v)));
            }
        }
        for &o in args.iter().filter(|&&o| writes.get(o as usize) != Some(&0)) {
            if let Some(at) = place(o) {
                let w = writers.entry(at).or_default();
                if !jumps {
                    w.clear();
                }
                if !w.contains(&o) {
                    w.push(o);
                }
            }
        }
    }
    pairs.sort_unstable();
    pairs.dedup();
    Views { pairs }
}

/// Folds every call it can but the `deferred` ones (sorted), in program order (so chains
/// of constant computations fold whole): a folded call becomes a `Nop`. Returns the
/// tensors that elided views read (see [`viewed`]), which must keep their planned
/// memory. A call whose kernel fails at load is left to run (and fail) at execution, as
/// it would without folding: it may sit in a branch that never runs.
pub(crate) fn fold_constants(
    deferred: &[CallId],
    chains: &mut [Vec<Instr>],
    m: &crate::alias::Method<'_>,
    values: &mut [Slot],
    memory: &mut Memory,
    inputs: &[u32],
    pool: &pte_compute::ThreadPool,
) -> Views {
    let crate::alias::Method {
        call_args,
        op_names,
        kernels,
        io,
        ..
    } = *m;
    let mut folded: Vec<CallId> = Vec::new();
    // Fused calls count as pure here: what they only read (an elided view among them)
    // is not written, so the view's source keeps its planned memory.
    let mut writes = writes(chains, m, values);
    let viewed = viewed(chains, call_args, values, &writes, inputs);
    let calls = chains.iter().enumerate().flat_map(|(chain, instrs)| {
        instrs
            .iter()
            .enumerate()
            .map(move |(instruction, instr)| (CallId { chain, instruction }, instr))
    });
    for (id, instr) in calls {
        let Instr::Kernel { op, args, .. } = instr else {
            continue;
        };
        if deferred.binary_search(&id).is_ok() {
            continue;
        }
        let Some(name) = op_names.get(*op as usize) else {
            continue;
        };
        let Some(k) = kernels.get(name).filter(|_| kernels.is_pure(name)) else {
            continue;
        };
        let args = call_args
            .get(args.start as usize..args.end as usize)
            .unwrap_or_default();
        let Some(outs) = call_outputs(args, values) else {
            continue;
        };
        let inputs_constant = args
            .iter()
            .filter(|a| !outs.contains(a))
            .all(|&a| is_constant(a, values, &writes, io));
        let outputs_free = outs.iter().all(|&o| {
            writes.get(o as usize) == Some(&1)
                && !io.contains(&o)
                && match values.get(o as usize) {
                    Some(Slot::Tensor(t)) => match t.storage {
                        Storage::Planned { .. } => !viewed.is_viewed(o),
                        Storage::Null => true,
                        _ => false,
                    },
                    Some(Slot::TensorList(_)) => true,
                    Some(Slot::Int(_) | Slot::Double(_) | Slot::Bool(_)) => true,
                    _ => false,
                }
        });
        if !(inputs_constant && outputs_free) {
            continue;
        }
        // Outputs get buffers of their own (their planned memory is shared with other
        // tensors over an execution), then the call runs.
        let saved: SmallVec<[(u32, Storage); 4]> = outs
            .iter()
            .filter_map(|&o| match values.get_mut(o as usize) {
                Some(Slot::Tensor(t)) => {
                    let before = t.storage;
                    t.storage = Storage::Heap { owner: o };
                    Some((o, before))
                }
                _ => None,
            })
            .collect();
        let mut a = Args {
            op: name,
            ids: args,
            values,
            memory,
            pool,
            staging: &crate::args::PASSING,
            derived: None,
        };
        let ran = k.prepare(&a).and_then(|mut p| p.run(&mut a)).is_ok();
        // Each output now holds a constant: its own buffer, or (a kernel that made its
        // output a view of its input) a constant input's bytes.
        let constant = |s: Storage, o: u32| {
            s == Storage::Heap { owner: o }
                || matches!(
                    s,
                    Storage::Program { .. } | Storage::External { .. } | Storage::Folded { .. }
                )
        };
        let ok = ran
            && saved.iter().all(|&(o, _)| {
                matches!(values.get(o as usize), Some(Slot::Tensor(t)) if constant(t.storage, o))
            });
        for &(o, before) in &saved {
            if let Some(Slot::Tensor(t)) = values.get_mut(o as usize) {
                if !ok {
                    t.storage = before;
                    memory.release_heap(o);
                } else if t.storage == (Storage::Heap { owner: o }) {
                    t.storage = Storage::Folded { owner: o };
                } else {
                    memory.release_heap(o);
                }
            }
        }
        if ok {
            folded.push(id);
            // No longer written at execution: later calls may fold on them.
            for &o in &outs {
                if let Some(w) = writes.get_mut(o as usize) {
                    *w = 0;
                }
            }
        }
    }
    for id in folded {
        if let Some(instr) = chains
            .get_mut(id.chain)
            .and_then(|c| c.get_mut(id.instruction))
        {
            *instr = Instr::Nop;
        }
    }
    viewed
}

/// Gives back the memory of constants computed at load that no call reads any more: every
/// call referring to one captured it when it was prepared (see
/// [`crate::PreparedKernel::consumed`]), and nothing else refers to it.
pub(crate) fn release_consumed(
    chains: &[Vec<Instr>],
    call_args: &[u32],
    values: &mut [Slot],
    prepared: &[Option<Box<dyn crate::PreparedKernel>>],
    memory: &mut Memory,
) {
    let mut still_read = vec![false; values.len()];
    for instr in chains.iter().flatten() {
        // Value indices at the positions the call captured.
        let mut captured: SmallVec<[u32; 4]> = match instr {
            Instr::Kernel { kernel, args, .. } => {
                let positions = prepared
                    .get(*kernel as usize)
                    .and_then(Option::as_ref)
                    .map_or(&[][..], |p| p.consumed());
                let args = call_args
                    .get(args.start as usize..args.end as usize)
                    .unwrap_or_default();
                positions
                    .iter()
                    .filter_map(|&i| args.get(i).copied())
                    .collect()
            }
            _ => SmallVec::new(),
        };
        // Sorted, so that each value's references and captures are counted in one
        // pass: a fused region refers to hundreds of values (counting each value's
        // references anew took shufflenet's load 0.4 ms).
        let mut refs = referenced(instr, call_args, values);
        refs.sort_unstable();
        captured.sort_unstable();
        for run in refs.chunk_by(|a, b| a == b) {
            let Some(&v) = run.first() else { continue };
            let from = captured.partition_point(|&c| c < v);
            let held = captured.get(from..).unwrap_or_default();
            // Captured everywhere this instruction refers to it, or still read.
            if held.iter().take_while(|&&c| c == v).count() != run.len() {
                if let Some(r) = still_read.get_mut(v as usize) {
                    *r = true;
                }
            }
        }
    }
    for (v, slot) in values.iter_mut().enumerate() {
        if let Slot::Tensor(t) = slot {
            if let (Storage::Folded { owner }, Some(false)) = (t.storage, still_read.get(v)) {
                memory.release_heap(owner);
                t.storage = Storage::Null;
            }
        }
    }
}
