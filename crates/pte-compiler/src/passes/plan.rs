//! Memory planning: every tensor that is not a constant gets an offset in one arena
//! (memory id 1), as upstream's `MemoryPlanningPass` does.
//!
//! 1. Lifetimes: the nodes are numbered in execution order (branches of control flow one
//!    after the other); a tensor lives from its first definition or use to its last use.
//!    Method inputs start at 0, outputs and mutable buffers live to the end. A value that
//!    a branch hands to a `torch.cond` output stays alive as long as that output.
//! 2. `view_copy` results share their input's memory: no copy is made at run time (static
//!    views are emitted as nothing, dynamic ones as `et_view`, which aliases).
//! 3. Placement: sizes (upper bounds for dynamic shapes) rounded up to 16 bytes, placed
//!    largest first at the lowest offset where they overlap no tensor alive at the same
//!    time (best fit). Upstream's greedy algorithm (shared objects) is run too; the smaller
//!    plan wins, so the arena is never larger than upstream's on the same graph.

use std::collections::HashMap;

use crate::dtype;
use crate::error::{CompileError, Result};
use crate::import::{InputKind, Program};
use crate::ir::{Arg, Node, ValueId, ValueKind};

/// Alignment of every planned tensor.
pub const ALIGNMENT: u64 = 16;

/// Where each planned tensor lives.
#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    /// Offset in the arena of every planned tensor value.
    pub offsets: HashMap<ValueId, u64>,
    /// `view_copy` outputs that alias their input.
    pub aliases: HashMap<ValueId, ValueId>,
    /// Arena size.
    pub total: u64,
    /// What upstream's greedy algorithm needs for the same tensors.
    pub upstream_greedy_total: u64,
}

struct Life {
    start: usize,
    end: usize,
}

struct Walker<'a> {
    p: &'a Program,
    life: HashMap<ValueId, Life>,
    index: usize,
    /// (branch output, cond output) pairs.
    moves: Vec<(ValueId, ValueId)>,
    aliases: HashMap<ValueId, ValueId>,
}

impl Walker<'_> {
    fn touch(&mut self, v: ValueId, at: usize) {
        let e = self.life.entry(v).or_insert(Life { start: at, end: at });
        e.start = e.start.min(at);
        e.end = e.end.max(at);
    }

    fn nodes(&mut self, nodes: &[Node]) {
        for n in nodes {
            self.index += 1;
            let at = self.index;
            let mut used = Vec::new();
            for a in &n.args {
                if let Arg::Block(_) = a {
                    continue;
                }
                a.values(&mut used);
            }
            for v in used {
                self.touch(v, at);
            }
            for &o in &n.outputs {
                self.touch(o, at);
            }
            if n.op.key() == "aten::view_copy.out" || n.op.key() == "aten::view_copy" {
                if let (Some(&out), Some(input)) =
                    (n.outputs.first(), n.args.first().and_then(Arg::tensor))
                {
                    if !self.p.constants.contains_key(&input) && !self.is_mutable_buffer(input) {
                        self.aliases.insert(out, input);
                    }
                }
            }
            for a in &n.args {
                if let Arg::Block(b) = a {
                    self.nodes(&b.nodes);
                    self.index += 1;
                    let end = self.index;
                    let mut outs = Vec::new();
                    for o in &b.outputs {
                        o.values(&mut outs);
                    }
                    for (&bo, &co) in outs.iter().zip(&n.outputs) {
                        self.touch(bo, end);
                        self.touch(co, end);
                        self.moves.push((bo, co));
                    }
                }
            }
        }
    }

    fn is_mutable_buffer(&self, v: ValueId) -> bool {
        let mutated = self.p.mutated_buffers();
        self.p
            .graph
            .inputs
            .iter()
            .zip(&self.p.input_kinds)
            .any(|(&i, k)| i == v && matches!(k, InputKind::Buffer(f) if mutated.contains(f)))
    }
}

fn root(aliases: &HashMap<ValueId, ValueId>, mut v: ValueId) -> ValueId {
    let mut guard = 0;
    while let Some(&n) = aliases.get(&v) {
        v = n;
        guard += 1;
        if guard > aliases.len() {
            break;
        }
    }
    v
}

/// Plans the program's memory.
pub fn run(p: &Program) -> Result<MemoryPlan> {
    let mut w = Walker {
        p,
        life: HashMap::new(),
        index: 0,
        moves: Vec::new(),
        aliases: HashMap::new(),
    };
    let mutated = p.mutated_buffers();
    let mut planned_inputs = Vec::new();
    for (&v, k) in p.graph.inputs.iter().zip(&p.input_kinds) {
        match k {
            InputKind::User => planned_inputs.push(v),
            InputKind::Buffer(f) if mutated.contains(f) => planned_inputs.push(v),
            _ => {}
        }
    }
    for &v in &planned_inputs {
        w.touch(v, 0);
    }
    w.nodes(&p.graph.nodes);
    let last = w.index + 1;
    let mut outs = Vec::new();
    for a in &p.graph.outputs {
        a.values(&mut outs);
    }
    for v in outs {
        w.touch(v, last);
    }
    for (&v, k) in p.graph.inputs.iter().zip(&p.input_kinds) {
        if matches!(k, InputKind::Buffer(f) if mutated.contains(f)) {
            w.touch(v, last);
        }
    }
    // A branch value moved into a cond output lives as long as that output.
    for (bo, co) in w.moves.clone().into_iter().rev() {
        let end = w.life.get(&co).map_or(0, |l| l.end);
        w.touch(bo, end);
    }

    // Group aliases under their roots.
    let mut groups: HashMap<ValueId, (u64, usize, usize)> = HashMap::new();
    let mut members: Vec<ValueId> = w.life.keys().copied().collect();
    members.sort_unstable();
    for &v in &members {
        if p.constants.contains_key(&v) && !planned_inputs.contains(&v) {
            continue;
        }
        let Some(meta) = p.graph.value(v).and_then(|x| match &x.kind {
            ValueKind::Tensor(m) => Some(m),
            _ => None,
        }) else {
            continue;
        };
        let numel = meta.sizes.iter().try_fold(1u64, |acc, d| {
            let n = match d.as_const() {
                Some(c) => Some(c),
                None => d.to_expr().upper_bound(&p.ranges),
            }?;
            acc.checked_mul(u64::try_from(n).ok()?)
        });
        let numel = numel.ok_or_else(|| {
            CompileError::unsupported(
                p.graph.name(v).to_owned(),
                "a dynamic size without an upper bound (export with Dim(..., max=N))",
            )
        })?;
        let bytes = numel
            .checked_mul(dtype::size_of(meta.dtype) as u64)
            .and_then(|b| b.checked_next_multiple_of(ALIGNMENT))
            .ok_or_else(|| CompileError::Overflow(format!("size of {}", p.graph.name(v))))?;
        let r = root(&w.aliases, v);
        let life = w.life.get(&v).map_or((0, 0), |l| (l.start, l.end));
        let g = groups.entry(r).or_insert((0, usize::MAX, 0));
        g.0 = g.0.max(bytes);
        g.1 = g.1.min(life.0);
        g.2 = g.2.max(life.1);
    }
    let mut items: Vec<(ValueId, u64, usize, usize)> = groups
        .into_iter()
        .map(|(v, (b, s, e))| (v, b, s, e))
        .collect();
    // Largest first; ties by start, then id, so plans are reproducible.
    items.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
    let (best, best_total) = best_fit(&items)?;
    let upstream = shared_objects(&items)?;
    let mut offsets = HashMap::new();
    let chosen = if upstream.1 < best_total {
        &upstream.0
    } else {
        &best
    };
    for &v in &members {
        let r = root(&w.aliases, v);
        if let Some(&off) = chosen.get(&r) {
            offsets.insert(v, off);
        }
    }
    Ok(MemoryPlan {
        offsets,
        aliases: w.aliases,
        total: best_total.min(upstream.1),
        upstream_greedy_total: upstream.1,
    })
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    !(a.1 < b.0 || b.1 < a.0)
}

/// Best fit: each tensor at the lowest offset free for its whole lifetime.
fn best_fit(items: &[(ValueId, u64, usize, usize)]) -> Result<(HashMap<ValueId, u64>, u64)> {
    let mut placed: Vec<(u64, u64, usize, usize)> = Vec::new();
    let mut out = HashMap::new();
    let mut total = 0u64;
    for &(v, size, s, e) in items {
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|p| overlaps((p.2, p.3), (s, e)))
            .map(|p| (p.0, p.0 + p.1))
            .collect();
        busy.sort_unstable();
        let mut offset = 0u64;
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        for &(b0, b1) in &busy {
            if b0 >= offset && b0 - offset >= size {
                let gap = b0 - offset;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, offset));
                }
            }
            offset = offset.max(b1);
        }
        let at = best.map_or(offset, |(_, o)| o);
        let end = at
            .checked_add(size)
            .ok_or_else(|| CompileError::Overflow("planned memory".into()))?;
        total = total.max(end);
        placed.push((at, size, s, e));
        out.insert(v, at);
    }
    Ok((out, total))
}

/// Upstream's greedy algorithm (`exir/memory_planning.py`, `greedy` with overlapping
/// allocations): shared objects that never grow, each holding tensors at offsets.
fn shared_objects(items: &[(ValueId, u64, usize, usize)]) -> Result<(HashMap<ValueId, u64>, u64)> {
    struct Obj {
        size: u64,
        allocs: Vec<(u64, u64, usize, usize)>,
    }
    let mut objs: Vec<Obj> = Vec::new();
    let mut where_: Vec<(ValueId, usize, u64)> = Vec::new();
    for &(v, size, s, e) in items {
        let mut picked = None;
        for (i, o) in objs.iter_mut().enumerate() {
            if o.allocs.iter().all(|a| !overlaps((a.2, a.3), (s, e))) {
                o.allocs.push((0, size, s, e));
                picked = Some((i, 0));
                break;
            }
        }
        if picked.is_none() {
            for (i, o) in objs.iter_mut().enumerate() {
                let max_off = o
                    .allocs
                    .iter()
                    .filter(|a| overlaps((a.2, a.3), (s, e)))
                    .map(|a| a.0 + a.1)
                    .max()
                    .unwrap_or(0);
                if max_off > 0 && max_off.checked_add(size).is_some_and(|end| end <= o.size) {
                    o.allocs.push((max_off, size, s, e));
                    picked = Some((i, max_off));
                    break;
                }
            }
        }
        let (i, off) = match picked {
            Some(p) => p,
            None => {
                objs.push(Obj {
                    size,
                    allocs: vec![(0, size, s, e)],
                });
                (objs.len() - 1, 0)
            }
        };
        where_.push((v, i, off));
    }
    let mut base = Vec::with_capacity(objs.len());
    let mut total = 0u64;
    for o in &objs {
        base.push(total);
        total = total
            .checked_add(o.size)
            .ok_or_else(|| CompileError::Overflow("planned memory".into()))?;
    }
    let out = where_
        .into_iter()
        .map(|(v, i, off)| (v, base.get(i).copied().unwrap_or(0) + off))
        .collect();
    Ok((out, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic tensors with random sizes and lifetimes.
    fn items(n: usize, seed: u64) -> Vec<(ValueId, u64, usize, usize)> {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut v: Vec<_> = (0..n)
            .map(|i| {
                let start = (next() % 50) as usize;
                let len = (next() % 20) as usize;
                let size = (next() % 64 + 1) * ALIGNMENT;
                (i, size, start, start + len)
            })
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
        v
    }

    fn check(items: &[(ValueId, u64, usize, usize)], at: &HashMap<ValueId, u64>, total: u64) {
        for (i, a) in items.iter().enumerate() {
            let oa = at[&a.0];
            assert!(oa + a.1 <= total);
            assert_eq!(oa % ALIGNMENT, 0);
            for b in items.iter().skip(i + 1) {
                if overlaps((a.2, a.3), (b.2, b.3)) {
                    let ob = at[&b.0];
                    assert!(
                        oa + a.1 <= ob || ob + b.1 <= oa,
                        "{a:?} at {oa} and {b:?} at {ob} overlap"
                    );
                }
            }
        }
    }

    #[test]
    fn plans_never_overlap_live_tensors() {
        for seed in 1..40u64 {
            let it = items(60, seed * 7919);
            let (bf, bt) = best_fit(&it).unwrap();
            check(&it, &bf, bt);
            let (so, st) = shared_objects(&it).unwrap();
            check(&it, &so, st);
            // Never above the sum of all sizes; the lower bound is the largest live set.
            assert!(bt <= it.iter().map(|x| x.1).sum::<u64>());
            let peak = (0..70)
                .map(|t| {
                    it.iter()
                        .filter(|x| x.2 <= t && t <= x.3)
                        .map(|x| x.1)
                        .sum::<u64>()
                })
                .max()
                .unwrap();
            assert!(bt >= peak && st >= peak);
        }
    }
}
