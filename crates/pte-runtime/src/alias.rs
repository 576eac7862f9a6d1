//! Copies that move no data, elided at method load.
//!
//! Exported programs are full of `*_copy` calls whose output holds exactly a run of
//! their input's elements, in order: `unsqueeze_copy` and `squeeze_copy`, an
//! `expand_copy` to the same shape, a `permute_copy` that moves only dimensions of size
//! 1, a `clone` that keeps the dim order, a `select_copy` of a leading dimension. The
//! registry's fuser names such calls ([`crate::Fuser::aliases`]); the runtime drops
//! each one whose input bytes nothing overwrites until the last read of its output (or
//! of the views the exporter elided on it), and points the output and those views at
//! the input's bytes instead.
//!
//! Only straight-line methods (one chain, no jumps) with static shapes are rewritten:
//! there the order of reads and writes is the order of the instructions.

use smallvec::SmallVec;

use crate::budget::{Charge, MemoryError};
use crate::fold::{call_outputs, Views};
use crate::fuse::{referenced, CallId, Graph};
use crate::memory::{Memory, Storage};
use crate::method::Instr;
use crate::registry::KernelRegistry;
use crate::value::{Dynamism, Slot};

/// A call whose output is the input's elements from `offset` on, in the same order (for
/// a call of several outputs, one alias each: the call is elided only with all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alias {
    pub call: CallId,
    pub input: u32,
    pub output: u32,
    /// In elements of the input.
    pub offset: usize,
}

/// What the rewrite needs to know about the method.
pub(crate) struct Method<'a> {
    pub call_args: &'a [u32],
    pub op_names: &'a [String],
    pub kernels: &'a KernelRegistry,
    /// Operators from this index on are fused calls (of pure calls only).
    pub fused_from: usize,
    pub io: &'a [u32],
    /// By delegate: the argument positions its calls write, when it says
    /// ([`crate::PreparedKernel::written`]).
    pub delegate_writes: &'a [Option<Vec<usize>>],
}

impl Method<'_> {
    pub(crate) fn is_pure(&self, op: u32) -> bool {
        op as usize >= self.fused_from
            || self
                .op_names
                .get(op as usize)
                .is_some_and(|name| self.kernels.is_pure(name))
    }

    /// The values an instruction may write: the outputs of a call of a pure operator
    /// or of a delegate that names them, every value any other instruction refers to.
    pub(crate) fn written(&self, instr: &Instr, values: &[Slot]) -> SmallVec<[u32; 16]> {
        let args = |r: &std::ops::Range<u32>| {
            self.call_args
                .get(r.start as usize..r.end as usize)
                .unwrap_or_default()
        };
        match instr {
            Instr::Kernel { op, args: r, .. } => {
                match call_outputs(args(r), values).filter(|_| self.is_pure(*op)) {
                    Some(outs) => outs.into_iter().collect(),
                    None => referenced(instr, self.call_args, values),
                }
            }
            Instr::Delegate { delegate, args: r } => {
                let positions = self.delegate_writes.get(*delegate as usize);
                match positions.and_then(Option::as_deref) {
                    Some(positions) => {
                        let args = args(r);
                        let mut outs: SmallVec<[u32; 16]> = SmallVec::new();
                        for v in positions.iter().filter_map(|&p| args.get(p).copied()) {
                            outs.push(v);
                            match values.get(v as usize) {
                                Some(Slot::TensorList(items)) => outs.extend_from_slice(items),
                                Some(Slot::OptionalTensorList(items)) => {
                                    outs.extend(items.iter().flatten().copied())
                                }
                                _ => {}
                            }
                        }
                        outs
                    }
                    None => referenced(instr, self.call_args, values),
                }
            }
            Instr::Move { to, .. } => SmallVec::from_slice(&[*to]),
            Instr::Free { value } => SmallVec::from_slice(&[*value]),
            Instr::JumpFalse { .. } | Instr::Nop => SmallVec::new(),
        }
    }
}

/// Elides the aliases the registry's fuser proposes that are safe (see the module
/// docs). `viewed` learns the new views.
pub(crate) fn elide(
    chains: &mut [Vec<Instr>],
    values: &mut [Slot],
    viewed: &mut Views,
    m: &Method<'_>,
    memory: &mut Memory,
) -> Result<(), MemoryError> {
    let Some(fuser) = m.kernels.fuser() else {
        return Ok(());
    };
    let [chain] = chains else {
        return Ok(());
    };
    if chain.iter().any(|i| matches!(i, Instr::JumpFalse { .. })) {
        return Ok(());
    }
    let mut proposals = {
        let graph = Graph::new(
            std::slice::from_ref(chain),
            m.call_args,
            m.op_names,
            values,
            m.io,
            viewed,
        );
        fuser.aliases(&graph)
    };
    proposals.sort_by_key(|a| (a.call.instruction, a.output));
    let mut uses = Uses::new(chain, values, m);
    let Some(mut moved) = Moved::new(memory) else {
        return Ok(());
    };
    // One call at a time, with the aliases of all its outputs.
    for group in proposals.chunk_by(|a, b| a.call == b.call) {
        let Some(first) = group.first() else {
            continue;
        };
        if group.iter().any(|a| a.input != first.input) {
            continue;
        }
        let outputs: SmallVec<[u32; 8]> = group.iter().map(|a| a.output).collect();
        let cx = Cx {
            chain,
            uses: &uses,
            viewed,
            m,
        };
        let judge = |values: &[Slot]| -> Option<Vec<Verdict>> {
            group
                .iter()
                .map(|a| check(a, &outputs, &cx, values))
                .collect()
        };
        let Some(mut verdicts) = judge(values) else {
            continue;
        };
        if verdicts.iter().any(|v| v.clobbered) {
            // Upstream's plan reuses the input's bytes while an output is still read
            // (the steps of an unrolled recurrence each slicing one product made for
            // all of them): give those bytes a place of their own, then look again.
            let relocated = relocate(first.input, &cx, values, &mut moved);
            match relocated.and_then(|()| judge(values)) {
                Some(v) if v.iter().all(|v| !v.clobbered) => verdicts = v,
                _ => continue,
            }
        }
        for Verdict {
            readers, storage, ..
        } in verdicts
        {
            for &r in &readers {
                if let Some(Slot::Tensor(t)) = values.get_mut(r as usize) {
                    t.storage = storage;
                }
                viewed.add(first.input, r);
            }
        }
        if let Some(i) = chain.get_mut(first.call.instruction) {
            *i = Instr::Nop;
            if let Some(w) = uses.written.get_mut(first.call.instruction) {
                w.clear();
            }
            // Written no more, the outputs are more views of the input's bytes.
            for &o in &outputs {
                if let Some(w) = uses.writes.get_mut(o as usize) {
                    *w = 0;
                }
            }
        }
    }
    moved.allocate(memory)
}

/// What [`check`] and [`relocate`] read of the method.
struct Cx<'a> {
    chain: &'a [Instr],
    uses: &'a Uses,
    viewed: &'a Views,
    m: &'a Method<'a>,
}

/// Who refers to what in the chain, computed once: the proposals are taken in the order
/// of their calls, so the instructions after the one being looked at are still as they
/// were (elided calls only come before it).
struct Uses {
    /// By value: the first and the last instruction referring to it.
    first: Vec<usize>,
    last: Vec<usize>,
    /// By value: the first instruction that may write it, and how many may.
    writer: Vec<usize>,
    writes: Vec<u32>,
    /// By instruction: the values it may write.
    written: Vec<SmallVec<[u32; 16]>>,
}

impl Uses {
    fn new(chain: &[Instr], values: &[Slot], m: &Method<'_>) -> Self {
        let mut uses = Uses {
            first: vec![usize::MAX; values.len()],
            last: vec![0; values.len()],
            writer: vec![usize::MAX; values.len()],
            writes: vec![0; values.len()],
            written: Vec::with_capacity(chain.len()),
        };
        for (k, i) in chain.iter().enumerate() {
            for v in referenced(i, m.call_args, values) {
                if let Some(f) = uses.first.get_mut(v as usize) {
                    *f = (*f).min(k);
                }
                if let Some(l) = uses.last.get_mut(v as usize) {
                    *l = k;
                }
            }
            let written = m.written(i, values);
            for &v in &written {
                if let Some(w) = uses.writer.get_mut(v as usize) {
                    *w = (*w).min(k);
                }
                if let Some(c) = uses.writes.get_mut(v as usize) {
                    *c = c.saturating_add(1);
                }
            }
            uses.written.push(written);
        }
        uses
    }

    /// The last instruction after `p` that refers to one of `vs`.
    fn last_after(&self, p: usize, vs: &[u32]) -> Option<usize> {
        let last = *vs.iter().filter_map(|&v| self.last.get(v as usize)).max()?;
        (last > p).then_some(last)
    }

    /// The first instruction that refers to one of `vs` (`usize::MAX` for none).
    fn first_of(&self, vs: &[u32]) -> usize {
        vs.iter()
            .filter_map(|&v| self.first.get(v as usize).copied())
            .min()
            .unwrap_or(usize::MAX)
    }
}

/// At most this share (1 / n) of the planned bytes, or [`MIN_RELOCATED_BYTES`] if more,
/// is moved to a buffer of its own so that copies can be elided (see [`relocate`]).
const RELOCATED_SHARE: usize = 2;
const MIN_RELOCATED_BYTES: usize = 1 << 20;

/// The planned buffer the tensors [`relocate`] moves share, one after the other: its
/// bytes are charged as tensors are placed, and it is allocated once, at the end.
struct Moved {
    /// The index it gets, after every planned buffer.
    buffer: u32,
    len: usize,
    held: Charge,
    /// Most bytes it may hold.
    allowance: usize,
}

impl Moved {
    fn new(memory: &Memory) -> Option<Self> {
        Some(Moved {
            buffer: u32::try_from(memory.planned_count()).ok()?,
            len: 0,
            held: memory.budget.charge(0).ok()?,
            allowance: (memory.planned_total() / RELOCATED_SHARE).max(MIN_RELOCATED_BYTES),
        })
    }

    /// Room for `nbytes` more: the buffer and the offset.
    fn place(&mut self, nbytes: usize) -> Option<(u32, usize)> {
        let offset = self.len.next_multiple_of(MOVED_ALIGNMENT);
        let end = offset.checked_add(nbytes)?;
        if end > self.allowance {
            return None;
        }
        self.held.grow(end as u64).ok()?;
        self.len = end;
        Some((self.buffer, offset))
    }

    /// Allocates the buffer, if anything was placed.
    fn allocate(self, memory: &mut Memory) -> Result<(), MemoryError> {
        let Moved {
            buffer, len, held, ..
        } = self;
        if len == 0 {
            return Ok(());
        }
        // The charge becomes the buffer's own.
        drop(held);
        let index = memory.add_planned(len)?;
        debug_assert_eq!(
            index, buffer,
            "no planned buffer is added while copies are elided"
        );
        Ok(())
    }
}

/// Alignment of a moved tensor in the shared buffer (a cache line).
const MOVED_ALIGNMENT: usize = 64;

/// What [`check`] finds of an alias that the method's calls allow.
struct Verdict {
    /// The output and the views on it.
    readers: SmallVec<[u32; 4]>,
    /// The input's bytes they are to read.
    storage: Storage,
    /// Whether an instruction writes those bytes before the last read of the readers:
    /// the alias is safe only when this is false.
    clobbered: bool,
}

/// The alias's [`Verdict`]; `None` when the calls or the tensors rule it out.
/// `outputs` are the outputs of the call that have aliases: all of its outputs.
fn check(a: &Alias, outputs: &[u32], cx: &Cx<'_>, values: &[Slot]) -> Option<Verdict> {
    let Cx {
        chain,
        uses,
        viewed,
        m,
    } = *cx;
    let writes = uses.writes.as_slice();
    let p = a.call.instruction;
    let Instr::Kernel { op, args, .. } = chain.get(p)? else {
        return None;
    };
    let args = m.call_args.get(args.start as usize..args.end as usize)?;
    // A pure call writing the outputs alone (and the list holding them), reading the
    // input; every other argument is fixed at load (not written at run time).
    let written = call_outputs(args, values)?;
    let tensors = written
        .iter()
        .filter(|&&v| matches!(values.get(v as usize), Some(Slot::Tensor(_))));
    if a.input == a.output
        || !m.is_pure(*op)
        || tensors.clone().count() != outputs.len()
        || !tensors.clone().all(|v| outputs.contains(v))
        || !args.contains(&a.input)
        || writes.get(a.output as usize) != Some(&1)
        || args
            .iter()
            .filter(|v| !written.contains(v))
            .any(|&v| !fixed(v, values, writes))
    {
        return None;
    }
    let tensor = |v: u32| match values.get(v as usize) {
        Some(Slot::Tensor(t)) if t.dynamism == Dynamism::Static => Some(t),
        _ => None,
    };
    let src = tensor(a.input)?;
    let dst = tensor(a.output)?;
    let (Storage::Planned { buffer, offset }, Storage::Planned { .. }) = (src.storage, dst.storage)
    else {
        return None;
    };
    // The output and the exporter's views on it: views not set or read by the caller,
    // not written, at the output's place.
    let mut readers: SmallVec<[u32; 4]> = SmallVec::from_slice(&[a.output]);
    for v in viewed.of(a.output) {
        let t = tensor(v)?;
        if t.storage != dst.storage || m.io.contains(&v) || writes.get(v as usize) != Some(&0) {
            return None;
        }
        readers.push(v);
    }
    let start = offset.checked_add(a.offset.checked_mul(src.info.dtype.size())?)?;
    let len = readers
        .iter()
        .filter_map(|&r| tensor(r))
        .map(|t| t.nbytes())
        .max()?;
    let end = start.checked_add(len)?;
    if src.info.dtype != dst.info.dtype || end > offset.checked_add(src.nbytes())? {
        return None;
    }
    // The last instruction reading any of them (the end for a method output, which the
    // caller reads after it), and no write to the input's bytes from the copy until
    // then (that instruction included).
    let last = if m.io.contains(&a.output) {
        chain.len().checked_sub(1)?
    } else {
        uses.last_after(p, &readers)?
    };
    let overlaps = |v: u32| match values.get(v as usize) {
        Some(Slot::Tensor(t)) => match t.storage {
            Storage::Planned {
                buffer: b,
                offset: o,
            } => {
                let bytes = t
                    .capacity
                    .max(t.numel())
                    .saturating_mul(t.info.dtype.size());
                b == buffer && o < end && start < o.saturating_add(bytes)
            }
            _ => false,
        },
        // Lists: `written` lists their tensors too.
        _ => false,
    };
    let clobbered = uses
        .written
        .get(p + 1..=last)?
        .iter()
        .any(|w| w.iter().any(|&v| overlaps(v)));
    Some(Verdict {
        readers,
        storage: Storage::Planned {
            buffer,
            offset: start,
        },
        clobbered,
    })
}

/// Moves the tensor whose bytes `input` reads (`input`, or the tensor an elided view
/// `input` is reads), with every elided view on it, to a planned buffer of its own.
/// Only for a static tensor that one pure call or delegate writes as its output, that
/// nothing reads before that call, and that the caller neither sets nor reads, while
/// `moved` has room. `None` when it is not moved.
fn relocate(input: u32, cx: &Cx<'_>, values: &mut [Slot], moved: &mut Moved) -> Option<()> {
    let mut root = input;
    for _ in 0..values.len() {
        match cx.viewed.source_of(root) {
            Some(s) => root = s,
            None => break,
        }
    }
    let mut family: SmallVec<[u32; 8]> = SmallVec::from_slice(&[root]);
    let mut k = 0;
    while let Some(&v) = family.get(k) {
        k += 1;
        for w in cx.viewed.of(v) {
            if !family.contains(&w) {
                family.push(w);
            }
        }
        if family.len() > MAX_RELOCATED_VIEWS {
            return None;
        }
    }
    let place = |v: u32| match values.get(v as usize) {
        Some(Slot::Tensor(t)) if t.dynamism == Dynamism::Static => match t.storage {
            Storage::Planned { buffer, offset } => Some((buffer, offset, t.nbytes())),
            _ => None,
        },
        _ => None,
    };
    let (buffer, offset, nbytes) = place(root)?;
    let end = offset.checked_add(nbytes)?;
    // The root is written once, its views never; none is the caller's.
    for &v in &family {
        let (b, o, n) = place(v)?;
        let expected = if v == root { 1 } else { 0 };
        if b != buffer
            || o < offset
            || o.checked_add(n)? > end
            || cx.uses.writes.get(v as usize) != Some(&expected)
            || cx.m.io.contains(&v)
        {
            return None;
        }
    }
    let writer = *cx.uses.writer.get(root as usize)?;
    // A writer that names what it writes: the root is its output, not a tensor it
    // updates in place.
    let named = match cx.chain.get(writer)? {
        Instr::Kernel { op, args, .. } => {
            let args = cx.m.call_args.get(args.start as usize..args.end as usize)?;
            cx.m.is_pure(*op) && call_outputs(args, values)?.contains(&root)
        }
        Instr::Delegate { delegate, .. } => {
            cx.m.delegate_writes
                .get(*delegate as usize)
                .is_some_and(Option::is_some)
        }
        _ => false,
    };
    if !named {
        return None;
    }
    if cx.uses.first_of(&family) < writer {
        return None;
    }
    let (to, at) = moved.place(nbytes)?;
    for &v in &family {
        if let Some(Slot::Tensor(t)) = values.get_mut(v as usize) {
            if let Storage::Planned { offset: o, .. } = t.storage {
                t.storage = Storage::Planned {
                    buffer: to,
                    offset: at + (o - offset),
                };
            }
        }
    }
    Some(())
}

/// Most views of one tensor [`relocate`] moves with it.
const MAX_RELOCATED_VIEWS: usize = 64;

/// True for a tensor, or a value no instruction writes (a list: nor its elements).
fn fixed(v: u32, values: &[Slot], writes: &[u32]) -> bool {
    let unwritten = |x: u32| writes.get(x as usize) == Some(&0);
    match values.get(v as usize) {
        Some(Slot::Tensor(_)) => true,
        Some(Slot::IntList(items)) => unwritten(v) && items.iter().all(|&i| unwritten(i)),
        Some(_) => unwritten(v),
        None => false,
    }
}
