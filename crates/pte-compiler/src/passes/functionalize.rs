//! Removes in-place operators and aliasing, as PyTorch's functionalization does.
//!
//! `torch.export` (training IR) keeps `x.relu_()`, `buf.add_(1)`, `x[:, 0] = v` and views.
//! Each tensor value belongs to a storage (its root): a view records how it is computed
//! from its root (a chain of view operators). An in-place operator becomes its functional
//! form; when it wrote through a view, the new root is rebuilt by scattering back along the
//! chain (`select_scatter`, `slice_scatter`, inverse views). Views of a storage written since
//! they were computed are recomputed from its current value when next read. Buffers and user
//! inputs written anywhere get a mutation output carrying their final value.

use std::collections::HashMap;

use crate::error::{CompileError, Result};
use crate::import::{InputKind, OutputKind, Program};
use crate::ir::{Arg, Graph, IntArg, Node, Op, ValueId, ValueKind};
use crate::schema;

/// Operators that only check things at export time.
const ASSERTS: &[&str] = &[
    "aten::_assert_tensor_metadata",
    "aten::_assert_scalar",
    "aten::_assert_async",
    "aten::sym_constrain_range",
    "aten::sym_constrain_range_for_size",
];

/// One view step: the node that computed a view from its input, and which of its outputs.
#[derive(Clone, Debug)]
struct Step {
    node: Node,
    output: usize,
}

#[derive(Default)]
struct State {
    /// View value -> (root, chain from the root).
    alias: HashMap<ValueId, (ValueId, Vec<Step>)>,
    /// Root -> its current value.
    current: HashMap<ValueId, ValueId>,
    /// Root -> number of writes so far.
    version: HashMap<ValueId, u64>,
    /// View value -> (root version, value valid at that version).
    cache: HashMap<ValueId, (u64, ValueId)>,
    /// Roots written at least once, in order of first write.
    written: Vec<ValueId>,
}

/// Runs the pass on a program's top-level graph; branches of control flow must be free of
/// mutation.
pub fn run(p: &mut Program) -> Result<()> {
    let old = std::mem::take(&mut p.graph.nodes);
    let mut st = State::default();
    for node in old {
        step(&mut p.graph, &mut st, node)?;
    }
    let mut outputs = std::mem::take(&mut p.graph.outputs);
    for a in &mut outputs {
        resolve_arg(&mut p.graph, &mut st, a)?;
    }
    p.graph.outputs = outputs;
    // Writes to inputs become mutation outputs.
    for root in st.written.clone() {
        let Some(pos) = p.graph.inputs.iter().position(|&i| i == root) else {
            continue;
        };
        let kind = match p.input_kinds.get(pos) {
            Some(InputKind::Buffer(fqn)) => OutputKind::BufferMutation(fqn.clone()),
            Some(InputKind::User) => OutputKind::UserInputMutation(p.graph.name(root).to_owned()),
            _ => {
                return Err(CompileError::unsupported(
                    p.graph.name(root).to_owned(),
                    "writing to a parameter or constant in place",
                ))
            }
        };
        let value = current(&st, root);
        // Mutation outputs come first, as in torch's functionalized graphs.
        let n = p
            .output_kinds
            .iter()
            .filter(|k| **k != OutputKind::User)
            .count();
        p.output_kinds.insert(n, kind);
        p.graph.outputs.insert(n, Arg::Tensor(value));
    }
    p.graph.remove_dead_nodes();
    check_branches(&p.graph.nodes)
}

fn check_branches(nodes: &[Node]) -> Result<()> {
    for n in nodes {
        for a in &n.args {
            if let Arg::Block(sub) = a {
                for sn in &sub.nodes {
                    if schema::lookup(&sn.op).is_some_and(|s| s.is_inplace()) {
                        return Err(CompileError::unsupported(
                            format!("{} inside {}", sn.op, n.op),
                            "in-place operators inside control flow",
                        ));
                    }
                }
                check_branches(&sub.nodes)?;
            }
        }
    }
    Ok(())
}

fn current(st: &State, root: ValueId) -> ValueId {
    st.current.get(&root).copied().unwrap_or(root)
}

/// The value to read for `v` now.
fn resolve(g: &mut Graph, st: &mut State, v: ValueId) -> Result<ValueId> {
    let Some((root, chain)) = st.alias.get(&v).cloned() else {
        return Ok(current(st, v));
    };
    let version = st.version.get(&root).copied().unwrap_or(0);
    if let Some(&(ver, val)) = st.cache.get(&v) {
        if ver == version {
            return Ok(val);
        }
    }
    let mut x = current(st, root);
    for s in &chain {
        x = replay(g, s, x)?;
    }
    st.cache.insert(v, (version, x));
    Ok(x)
}

fn resolve_arg(g: &mut Graph, st: &mut State, a: &mut Arg) -> Result<()> {
    let mut ids = Vec::new();
    a.values(&mut ids);
    let mut map = HashMap::new();
    for id in ids {
        if let std::collections::hash_map::Entry::Vacant(e) = map.entry(id) {
            e.insert(resolve(g, st, id)?);
        }
    }
    a.map_values(&mut |v| map.get(&v).copied().unwrap_or(v));
    Ok(())
}

/// Recomputes one view step on a new input.
fn replay(g: &mut Graph, s: &Step, input: ValueId) -> Result<ValueId> {
    let mut args = s.node.args.clone();
    if let Some(first) = args.first_mut() {
        *first = Arg::Tensor(input);
    }
    let outs: Vec<(String, ValueKind)> = s
        .node
        .outputs
        .iter()
        .map(|&o| {
            let v = g.value(o).cloned();
            (
                v.as_ref().map_or("view".into(), |v| v.name.clone()),
                v.map_or(ValueKind::Unused, |v| v.kind),
            )
        })
        .collect();
    let ids = g.push(s.node.op.clone(), args, outs);
    ids.get(s.output)
        .copied()
        .ok_or_else(|| CompileError::invalid(s.node.op.key(), "view output index"))
}

fn step(g: &mut Graph, st: &mut State, mut node: Node) -> Result<()> {
    let key = node.op.name.as_str();
    if ASSERTS.contains(&key) {
        return Ok(());
    }
    if node.op.is_cond() {
        for a in &mut node.args {
            if !matches!(a, Arg::Block(_)) {
                resolve_arg(g, st, a)?;
            }
        }
        g.nodes.push(node);
        return Ok(());
    }
    // `detach_`, `requires_grad_` and friends change nothing but autograd state.
    if matches!(
        key,
        "aten::detach_" | "aten::requires_grad_" | "aten::retain_grad"
    ) {
        let input = node.args.first().and_then(Arg::tensor);
        if let (Some(input), Some(&out)) = (input, node.outputs.first()) {
            alias_of(st, out, input, None);
        }
        return Ok(());
    }
    let schema = schema::lookup(&node.op);
    if let Some(s) = schema.filter(|s| s.is_inplace()) {
        return inplace(g, st, node, s);
    }
    // A view aliases the storage of the value it names, not of the value that name
    // resolves to now.
    let input = node.args.first().and_then(Arg::tensor);
    for a in &mut node.args {
        resolve_arg(g, st, a)?;
    }
    let is_view = schema.is_some_and(|s| s.is_view());
    g.nodes.push(node.clone());
    if let (true, Some(input)) = (is_view, input) {
        for (i, &out) in node.outputs.iter().enumerate() {
            let step = Step {
                node: node.clone(),
                output: i,
            };
            alias_of(st, out, input, Some(step));
        }
    }
    Ok(())
}

/// Records that `out` is `input` seen through `step` (or `input` itself), valid now.
fn alias_of(st: &mut State, out: ValueId, input: ValueId, step: Option<Step>) {
    let (root, mut chain) = st
        .alias
        .get(&input)
        .cloned()
        .unwrap_or_else(|| (input, Vec::new()));
    let valid = match &step {
        Some(_) => out,
        None => st
            .alias
            .get(&input)
            .and_then(|_| st.cache.get(&input).map(|c| c.1))
            .unwrap_or_else(|| current(st, input)),
    };
    chain.extend(step);
    let version = st.version.get(&root).copied().unwrap_or(0);
    st.alias.insert(out, (root, chain));
    st.cache.insert(out, (version, valid));
}

fn inplace(g: &mut Graph, st: &mut State, mut node: Node, s: &schema::Schema) -> Result<()> {
    let target = node.args.first().and_then(Arg::tensor).ok_or_else(|| {
        CompileError::invalid(node.op.key(), "in-place operator without a tensor")
    })?;
    for a in node.args.iter_mut().skip(1) {
        resolve_arg(g, st, a)?;
    }
    let self_now = resolve(g, st, target)?;
    let name = s.op.name.strip_suffix('_').unwrap_or(&s.op.name);
    let fop = Op::new(name, &s.op.overload);
    if schema::lookup(&fop).is_none() {
        return Err(CompileError::NoDecomposition {
            ops: vec![node.op.key()],
        });
    }
    let meta = g
        .meta(self_now)
        .cloned()
        .ok_or_else(|| CompileError::invalid(node.op.key(), "in-place target is not a tensor"))?;
    let mut args = std::mem::take(&mut node.args);
    if let Some(first) = args.first_mut() {
        *first = Arg::Tensor(self_now);
    }
    let out_name = node.outputs.first().map_or("inplace".to_owned(), |&o| {
        g.name(o).trim_end_matches('_').to_owned()
    });
    let result = g.push1(fop, args, &out_name, meta);
    write_back(g, st, target, result)?;
    // The in-place operator's output is the written tensor.
    if let Some(&out) = node.outputs.first() {
        let (root, chain) = st
            .alias
            .get(&target)
            .cloned()
            .unwrap_or_else(|| (target, Vec::new()));
        let version = st.version.get(&root).copied().unwrap_or(0);
        st.alias.insert(out, (root, chain));
        st.cache.insert(out, (version, result));
    }
    Ok(())
}

/// Makes `value` the new content of `target` (a root or a view).
fn write_back(g: &mut Graph, st: &mut State, target: ValueId, value: ValueId) -> Result<()> {
    let (root, chain) = st
        .alias
        .get(&target)
        .cloned()
        .unwrap_or_else(|| (target, Vec::new()));
    // Values along the chain, from the root's current value.
    let mut xs = vec![current(st, root)];
    for s in chain.iter().take(chain.len().saturating_sub(1)) {
        let last = *xs.last().unwrap_or(&root);
        xs.push(replay(g, s, last)?);
    }
    let mut new = value;
    for (s, &base) in chain.iter().zip(&xs).rev() {
        new = scatter(g, s, base, new)?;
    }
    st.current.insert(root, new);
    let v = st.version.entry(root).or_insert(0);
    *v += 1;
    let version = *v;
    st.cache.insert(target, (version, value));
    if !st.written.contains(&root) {
        st.written.push(root);
    }
    Ok(())
}

/// The new `base` after writing `src` into the view `s` of it.
fn scatter(g: &mut Graph, s: &Step, base: ValueId, src: ValueId) -> Result<ValueId> {
    let meta = g
        .meta(base)
        .cloned()
        .ok_or_else(|| CompileError::invalid(s.node.op.key(), "view of a non-tensor"))?;
    let name = format!("{}_scatter", g.name(base));
    let arg = |i: usize| s.node.args.get(i).cloned().unwrap_or(Arg::None);
    let op = s.node.op.key();
    let (op, args) = match op.as_str() {
        "aten::select.int" => (
            Op::new("aten::select_scatter", ""),
            vec![Arg::Tensor(base), Arg::Tensor(src), arg(1), arg(2)],
        ),
        "aten::slice.Tensor" => (
            Op::new("aten::slice_scatter", ""),
            vec![
                Arg::Tensor(base),
                Arg::Tensor(src),
                arg(1),
                arg(2),
                arg(3),
                arg(4),
            ],
        ),
        "aten::narrow" => {
            let end = match (arg(2).int(), arg(3).int()) {
                (Some(a), Some(b)) => Arg::Int(a + b),
                _ => {
                    return Err(CompileError::unsupported(
                        op,
                        "writing through a dynamic narrow",
                    ))
                }
            };
            (
                Op::new("aten::slice_scatter", ""),
                vec![
                    Arg::Tensor(base),
                    Arg::Tensor(src),
                    arg(1),
                    arg(2),
                    end,
                    Arg::Int(1),
                ],
            )
        }
        "aten::unbind.int" => (
            Op::new("aten::select_scatter", ""),
            vec![
                Arg::Tensor(base),
                Arg::Tensor(src),
                arg(1),
                Arg::Int(s.output as i64),
            ],
        ),
        "aten::view"
        | "aten::reshape"
        | "aten::_unsafe_view"
        | "aten::alias"
        | "aten::detach"
        | "aten::unflatten.int"
        | "aten::flatten.using_ints"
        | "aten::squeeze.dim"
        | "aten::squeeze.dims"
        | "aten::squeeze"
        | "aten::unsqueeze"
        | "aten::contiguous"
        | "aten::view_as"
        | "aten::expand_as" => {
            let sizes = meta
                .sizes
                .iter()
                .map(|d| d.as_const().map(IntArg::Const))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    CompileError::unsupported(
                        op.clone(),
                        "writing through a view of a dynamic shape",
                    )
                })?;
            (
                Op::new("aten::view", ""),
                vec![Arg::Tensor(src), Arg::Ints(sizes)],
            )
        }
        "aten::transpose.int" => (
            Op::new("aten::transpose", "int"),
            vec![Arg::Tensor(src), arg(1), arg(2)],
        ),
        "aten::t" => (Op::new("aten::t", ""), vec![Arg::Tensor(src)]),
        "aten::permute" => {
            let dims = arg(1).ints().unwrap_or_default();
            let rank = dims.len() as i64;
            let mut inv = vec![0i64; dims.len()];
            for (i, &d) in dims.iter().enumerate() {
                let d = if d < 0 { d + rank } else { d };
                if let Some(slot) = inv.get_mut(d as usize) {
                    *slot = i as i64;
                }
            }
            (
                Op::new("aten::permute", ""),
                vec![
                    Arg::Tensor(src),
                    Arg::Ints(inv.into_iter().map(IntArg::Const).collect()),
                ],
            )
        }
        _ => {
            return Err(CompileError::unsupported(
                op,
                "writing in place through this kind of view",
            ))
        }
    };
    Ok(g.push1(op, args, &name, meta))
}
