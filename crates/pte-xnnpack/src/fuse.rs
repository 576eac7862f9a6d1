//! Rewrites of a validated graph that save passes over memory without changing results
//! beyond float rounding.
//!
//! - A Clamp node whose input another node produces for it alone merges its bounds
//!   into that node's output bounds, as XNNPACK's subgraph optimization does (same
//!   producers: addition, multiplication, convolutions, fully connected, pooling,
//!   clamp): the quantized graphs upstream exports have a Clamp after most
//!   convolutions, and upstream computes them fused.
//! - `Multiply(v, Sigmoid(v))` (SiLU, as exported) becomes one SiLU node, and a SiLU
//!   or hardswish whose input a float convolution or fully connected node produces
//!   only for it runs in that node's epilogue, on each output tile while it is in
//!   cache (hardswish as XNNPACK computes it). Only fp32 values are fused (an fp16
//!   graph rounds the sigmoid's output to fp16 before the product, which the fused
//!   form would skip).
//!
//! - A float depthwise convolution (multiplier 1) with the 1×1 convolution producing
//!   its input, the 1×1 convolution reading its output, and an addition of that
//!   output to a value of the same shape (the inverted residual block of mobilenet_v2
//!   and efficientnet: any of expansion and projection, at least one) becomes one
//!   node, run band by band of rows with the expanded values in cache as the plain
//!   programs' NHWC regions run it (`ops::conv`, pte-compute's `DepthwiseChain`).
//!
//! Only values that are neither graph outputs nor read by any other node are fused
//! away.

use pte_compute::elementwise::Activation;

use crate::graph::{BinaryOp, Chain, Datatype, Graph, Node, Op, UnaryOp};

/// Applies the rewrites.
pub(crate) fn fuse(g: &mut Graph) {
    fuse_clamps(g);
    fuse_silu(g);
    fuse_activations(g);
    fuse_depthwise_chains(g);
}

/// How many nodes read each value, graph outputs counted as readers.
fn readers(g: &Graph) -> Vec<usize> {
    let mut readers = vec![0usize; g.values.len()];
    for i in g
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter().flatten())
        .chain(&g.outputs)
    {
        if let Some(r) = readers.get_mut(*i) {
            *r += 1;
        }
    }
    readers
}

/// The node producing each value.
fn producers(g: &Graph) -> Vec<Option<usize>> {
    let mut p = vec![None; g.values.len()];
    for (k, node) in g.nodes.iter().enumerate() {
        for &o in &node.outputs {
            if let Some(slot) = p.get_mut(o) {
                *slot = Some(k);
            }
        }
    }
    p
}

/// Clamp nodes into the nodes producing their inputs (see the module docs).
fn fuse_clamps(g: &mut Graph) {
    let readers = readers(g);
    let mut producer = producers(g);
    let mut removed = vec![false; g.nodes.len()];
    for c in 0..g.nodes.len() {
        let Some(clamp) = g.nodes.get(c) else {
            continue;
        };
        let (Some(Some(x)), Some(&out)) = (clamp.inputs.first(), clamp.outputs.first()) else {
            continue;
        };
        if clamp.op != Op::Unary(UnaryOp::Clamp) || readers.get(*x) != Some(&1) {
            continue;
        }
        let (x, min, max) = (*x, clamp.min, clamp.max);
        let Some(p) = producer.get(x).copied().flatten() else {
            continue;
        };
        let Some(pn) = g.nodes.get_mut(p) else {
            continue;
        };
        let fusable = matches!(
            pn.op,
            Op::Binary(BinaryOp::Add | BinaryOp::Multiply)
                | Op::Unary(UnaryOp::Clamp)
                | Op::Conv2d(_)
                | Op::DepthwiseConv2d(_)
                | Op::FullyConnected { .. }
                | Op::MaxPooling2d(_)
                | Op::AvgPooling2d(_)
        ) && pn.outputs.as_slice() == [x]
            && pn.fused.is_none()
            && pn.min.max(min) <= pn.max.min(max);
        if !fusable {
            continue;
        }
        pn.min = pn.min.max(min);
        pn.max = pn.max.min(max);
        pn.outputs = [out].into_iter().collect();
        if let Some(slot) = producer.get_mut(out) {
            *slot = Some(p);
        }
        if let Some(r) = removed.get_mut(c) {
            *r = true;
        }
    }
    retain(g, &removed);
}

/// Drops the nodes marked removed.
fn retain(g: &mut Graph, removed: &[bool]) {
    let mut k = 0;
    g.nodes.retain(|_| {
        let keep = !removed.get(k).copied().unwrap_or(false);
        k += 1;
        keep
    });
}

/// `Multiply(v, Sigmoid(v))` as one SiLU node (see the module docs).
fn fuse_silu(g: &mut Graph) {
    let mut readers = readers(g);
    let producer = producers(g);
    let f32_value = |g: &Graph, v: usize| g.values.get(v).is_some_and(|v| v.dtype == Datatype::F32);
    let unbounded = |min: f32, max: f32| min == f32::NEG_INFINITY && max == f32::INFINITY;
    let mut removed = vec![false; g.nodes.len()];
    for m in 0..g.nodes.len() {
        let Some(node) = g.nodes.get(m) else { continue };
        if node.op != Op::Binary(BinaryOp::Multiply) || !unbounded(node.min, node.max) {
            continue;
        }
        let (Some(Some(a)), Some(Some(b)), Some(&out)) = (
            node.inputs.first(),
            node.inputs.get(1),
            node.outputs.first(),
        ) else {
            continue;
        };
        // Which input is the sigmoid of the other.
        let sigmoid_of = |s: usize, x: usize| -> Option<usize> {
            let k = (*producer.get(s)?)?;
            let sn = g.nodes.get(k)?;
            (sn.op == Op::Unary(UnaryOp::Sigmoid)
                && sn.inputs.first() == Some(&Some(x))
                && readers.get(s) == Some(&1)
                && !removed.get(k).copied().unwrap_or(true))
            .then_some(k)
        };
        let (x, s_node) = match (sigmoid_of(*b, *a), sigmoid_of(*a, *b)) {
            (Some(k), _) => (*a, k),
            (None, Some(k)) => (*b, k),
            _ => continue,
        };
        let s = g.nodes.get(s_node).and_then(|n| n.outputs.first().copied());
        if ![Some(x), s, Some(out)]
            .iter()
            .all(|v| v.is_some_and(|v| f32_value(g, v)))
        {
            continue;
        }
        if let Some(r) = removed.get_mut(s_node) {
            *r = true;
        }
        if let Some(r) = readers.get_mut(x) {
            *r -= 1;
        }
        if let Some(node) = g.nodes.get_mut(m) {
            node.op = Op::Unary(UnaryOp::Silu);
            node.kind = "Sigmoid+Multiply";
            node.inputs = [Some(x)].into_iter().collect();
        }
    }
    retain(g, &removed);
}

/// Moves each SiLU and hardswish node into the epilogue of the float convolution or
/// fully connected node producing its input for it alone, which then applies it to
/// each output tile while in cache (a pass over memory saved: hardswish nodes took
/// 6% of mobilenet_v3_small). Only fp32 values (an fp16 graph rounds in between).
fn fuse_activations(g: &mut Graph) {
    let readers = readers(g);
    let producer = producers(g);
    let unbounded = |n: &Node| n.min == f32::NEG_INFINITY && n.max == f32::INFINITY;
    let mut removed = vec![false; g.nodes.len()];
    for m in 0..g.nodes.len() {
        let Some(node) = g.nodes.get(m) else { continue };
        let act = match node.op {
            Op::Unary(UnaryOp::Silu) => Activation::Silu,
            Op::Unary(UnaryOp::Hardswish) => Activation::HardSwishFused,
            _ => continue,
        };
        let (Some(&Some(x)), Some(&out)) = (node.inputs.first(), node.outputs.first()) else {
            continue;
        };
        let Some(p) = producer.get(x).copied().flatten() else {
            continue;
        };
        let Some(pn) = g.nodes.get(p) else { continue };
        let fusable = unbounded(node)
            && matches!(
                pn.op,
                Op::Conv2d(_) | Op::DepthwiseConv2d(_) | Op::FullyConnected { .. }
            )
            && unbounded(pn)
            && pn.fused.is_none()
            && readers.get(x) == Some(&1)
            && all_f32(g, &[Some(x), Some(out)])
            && pn
                .inputs
                .iter()
                .flatten()
                .all(|&i| g.values.get(i).is_some_and(|v| v.dtype.is_float()));
        if fusable {
            if let Some(pn) = g.nodes.get_mut(p) {
                pn.outputs = [out].into_iter().collect();
                pn.fused = Some(act);
            }
            if let Some(r) = removed.get_mut(m) {
                *r = true;
            }
        }
    }
    retain(g, &removed);
}

/// Whether every listed value is fp32.
fn all_f32(g: &Graph, values: &[Option<usize>]) -> bool {
    values.iter().all(|v| {
        v.and_then(|v| g.values.get(v))
            .is_some_and(|v| v.dtype == Datatype::F32)
    })
}

/// Whether a convolution node's filter and bias (if any) are constants.
fn constant_weights(g: &Graph, node: &Node) -> bool {
    let constant = |v: usize| g.values.get(v).is_some_and(|v| v.data.is_some());
    node.inputs.get(1).copied().flatten().is_some_and(constant)
        && node.inputs.get(2).copied().flatten().is_none_or(constant)
}

/// A float 1×1 convolution, stride 1, unpadded, one group, with constant weights,
/// reading input 0 and writing one value.
fn pointwise(g: &Graph, node: &Node) -> bool {
    let Op::Conv2d(c) = &node.op else {
        return false;
    };
    c.kernel == [1, 1]
        && c.stride == [1, 1]
        && c.dilation == [1, 1]
        && c.padding == [0; 4]
        && c.groups == 1
        && node.flags == 0
        && node.chain.is_none()
        && node.outputs.len() == 1
        && constant_weights(g, node)
        && all_f32(
            g,
            &[
                node.inputs.first().copied().flatten(),
                node.outputs.first().copied(),
            ],
        )
}

/// Depthwise convolutions with their pointwise neighbours and residual addition into
/// one node (see the module docs); the fused node takes the place of the chain's last.
fn fuse_depthwise_chains(g: &mut Graph) {
    let readers = readers(g);
    let producer = producers(g);
    // The node reading each value, where one node alone reads it.
    let mut reader = vec![None; g.values.len()];
    for (k, node) in g.nodes.iter().enumerate() {
        for &i in node.inputs.iter().flatten() {
            if let Some(r) = reader.get_mut(i) {
                *r = Some(k);
            }
        }
    }
    let only_reader = |v: usize| {
        (readers.get(v) == Some(&1))
            .then(|| reader.get(v).copied().flatten())
            .flatten()
    };
    let unbounded = |n: &Node| n.min == f32::NEG_INFINITY && n.max == f32::INFINITY;
    let mut removed = vec![false; g.nodes.len()];
    for d in 0..g.nodes.len() {
        let Some(dn) = g.nodes.get(d) else { continue };
        let Op::DepthwiseConv2d(geo) = &dn.op else {
            continue;
        };
        let (Some(Some(x)), Some(&y)) = (dn.inputs.first(), dn.outputs.first()) else {
            continue;
        };
        let (x, y) = (*x, y);
        let ok = geo.group_input_channels == 1
            && geo.group_output_channels == 1
            && dn.flags == 0
            && dn.chain.is_none()
            && dn.outputs.len() == 1
            && !removed.get(d).copied().unwrap_or(true)
            && constant_weights(g, dn)
            && all_f32(g, &[Some(x), Some(y)]);
        if !ok {
            continue;
        }
        let usable = |k: usize| !removed.get(k).copied().unwrap_or(true);
        let expand = producer
            .get(x)
            .copied()
            .flatten()
            .filter(|&e| readers.get(x) == Some(&1) && usable(e))
            .filter(|&e| g.nodes.get(e).is_some_and(|n| pointwise(g, n)));
        let project = only_reader(y).filter(|&p| {
            usable(p)
                && g.nodes
                    .get(p)
                    .is_some_and(|n| pointwise(g, n) && n.inputs.first() == Some(&Some(y)))
        });
        // The addition of the projection's output and another value of its shape.
        let residual = project.and_then(|p| {
            let pn = g.nodes.get(p)?;
            let po = *pn.outputs.first()?;
            if !unbounded(pn) || pn.fused.is_some() {
                return None;
            }
            let a = only_reader(po).filter(|&a| usable(a))?;
            let an = g.nodes.get(a)?;
            let (i0, i1) = (an.inputs.first().copied()?, an.inputs.get(1).copied()?);
            let r = if i0 == Some(po) { i1? } else { i0? };
            let out = *an.outputs.first()?;
            let dims = |v: usize| g.values.get(v).map(|v| &v.dims);
            let fits = an.op == Op::Binary(BinaryOp::Add)
                && an.inputs.len() == 2
                && an.outputs.len() == 1
                && an.flags == 0
                && an.fused.is_none()
                && (i0 == Some(po)) != (i1 == Some(po))
                && dims(r) == dims(po)
                && dims(out) == dims(po)
                && all_f32(g, &[Some(r), Some(out)]);
            fits.then_some((a, r, out, an.min, an.max))
        });
        if expand.is_none() && project.is_none() {
            continue;
        }
        let node_at = |k: Option<usize>| k.and_then(|k| g.nodes.get(k)).cloned();
        let (expand_node, project_node) = (node_at(expand), node_at(project));
        let input = match &expand_node {
            Some(e) => e.inputs.first().copied().flatten(),
            None => Some(x),
        };
        let output = match (residual, &project_node) {
            (Some((_, _, out, _, _)), _) => Some(out),
            (None, Some(p)) => p.outputs.first().copied(),
            (None, None) => Some(y),
        };
        let (Some(input), Some(output)) = (input, output) else {
            continue;
        };
        let mut node = dn.clone();
        node.kind = match (expand.is_some(), project.is_some(), residual.is_some()) {
            (true, true, true) => "Conv2d+DepthwiseConv2d+Conv2d+Add",
            (true, true, false) => "Conv2d+DepthwiseConv2d+Conv2d",
            (true, false, _) => "Conv2d+DepthwiseConv2d",
            (false, _, true) => "DepthwiseConv2d+Conv2d+Add",
            (false, _, false) => "DepthwiseConv2d+Conv2d",
        };
        node.inputs = [
            Some(input),
            dn.inputs.get(1).copied().flatten(),
            dn.inputs.get(2).copied().flatten(),
            residual.map(|r| r.1),
        ]
        .into_iter()
        .collect();
        node.outputs = [output].into_iter().collect();
        node.chain = Some(Box::new(Chain {
            expand: expand_node,
            project: project_node,
            residual: residual.map(|r| (r.3, r.4)),
        }));
        let last = residual.map(|r| r.0).or(project).unwrap_or(d);
        for k in [expand, Some(d), project, residual.map(|r| r.0)]
            .into_iter()
            .flatten()
        {
            if let Some(r) = removed.get_mut(k) {
                *r = k != last;
            }
        }
        if let Some(slot) = g.nodes.get_mut(last) {
            *slot = node;
        }
    }
    retain(g, &removed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The XNNPACK payloads of a program of `tests/xnnpack`.
    fn payloads(name: &str) -> Vec<Vec<u8>> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/xnnpack")
            .join(name)
            .join("model.pte");
        let bytes = std::fs::read(path).unwrap();
        let pte = pte_format::Pte::parse(&bytes).unwrap();
        let plan = pte
            .program()
            .execution_plan()
            .unwrap()
            .unwrap()
            .get(0)
            .unwrap()
            .unwrap();
        plan.delegates()
            .unwrap()
            .unwrap()
            .iter()
            .map(|d| {
                pte.delegate_data(d.unwrap().processed().unwrap().unwrap())
                    .unwrap()
                    .to_vec()
            })
            .collect()
    }

    fn kinds(g: &Graph) -> Vec<&'static str> {
        g.nodes.iter().map(|n| n.kind).collect()
    }

    #[test]
    fn silu_fuses_into_producers_only_when_nothing_else_reads() {
        let p = payloads("xnn_silu");
        // Conv's SiLU into the conv; the depthwise output is read twice: a SiLU node.
        let mut g = Graph::summary(&p[0]).unwrap();
        fuse(&mut g);
        assert_eq!(
            kinds(&g),
            [
                "StaticTranspose",
                "Conv2d",
                "DepthwiseConv2d",
                "Sigmoid+Multiply",
                "Add",
                "StaticTranspose"
            ]
        );
        assert_eq!(g.nodes[1].fused, Some(Activation::Silu));
        assert_eq!(g.nodes[2].fused, None);
        // The linear layer's SiLU into it; the input's SiLU stays a node.
        let mut g = Graph::summary(&p[1]).unwrap();
        fuse(&mut g);
        let mut k = kinds(&g);
        k.sort_unstable();
        assert_eq!(k, ["FullyConnected", "Sigmoid+Multiply"]);
        assert!(g.nodes.iter().any(|n| n.fused == Some(Activation::Silu)));
    }

    #[test]
    fn hardswish_runs_in_the_convolution_before_it() {
        let p = payloads("xnn_convnet");
        let mut g = Graph::summary(&p[0]).unwrap();
        let before = kinds(&g).iter().filter(|&&k| k == "Hardswish").count();
        fuse(&mut g);
        assert!(before >= 1);
        assert!(!kinds(&g).contains(&"Hardswish"));
        let fused = g
            .nodes
            .iter()
            .filter(|n| n.fused == Some(Activation::HardSwishFused));
        assert_eq!(fused.count(), before);
    }

    #[test]
    fn inverted_residual_blocks_become_one_node() {
        // Upstream splits the program at the gate's mean: two payloads.
        let mut chains = Vec::new();
        let mut pointwise = 0;
        for p in payloads("xnn_inverted_residual") {
            let mut g = Graph::summary(&p).unwrap();
            fuse(&mut g);
            chains.extend(
                kinds(&g)
                    .into_iter()
                    .filter(|k| k.contains("DepthwiseConv2d")),
            );
            pointwise += g
                .nodes
                .iter()
                .filter(|n| matches!(&n.op, Op::Conv2d(c) if c.kernel == [1, 1]))
                .count();
        }
        // Residual blocks whole; the stride-2 block without its addition; the gated
        // block's depthwise output is read twice: its expansion only.
        assert_eq!(
            chains,
            [
                "Conv2d+DepthwiseConv2d+Conv2d+Add",
                "Conv2d+DepthwiseConv2d+Conv2d+Add",
                "Conv2d+DepthwiseConv2d+Conv2d",
                "Conv2d+DepthwiseConv2d",
                "Conv2d+DepthwiseConv2d+Conv2d+Add",
            ]
        );
        // Of the 1×1 convolutions, only the gated block's projection is left.
        assert_eq!(pointwise, 1);
    }
}
