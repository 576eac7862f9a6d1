//! Rewrites of a validated graph that save passes over memory without changing results
//! beyond float rounding.
//!
//! - A Clamp node whose input another node produces for it alone merges its bounds
//!   into that node's output bounds, as XNNPACK's subgraph optimization does (same
//!   producers: addition, multiplication, convolutions, fully connected, pooling,
//!   clamp): the quantized graphs upstream exports have a Clamp after most
//!   convolutions, and upstream computes them fused.
//! - `Multiply(v, Sigmoid(v))` (SiLU, as exported) becomes one SiLU node, and a SiLU
//!   whose input a float convolution or fully connected node produces only for it
//!   runs in that node's epilogue, on each output tile while it is in cache. Only fp32
//!   values are fused (an fp16 graph rounds the sigmoid's output to fp16 before the
//!   product, which the fused form would skip).
//!
//! Only values that are neither graph outputs nor read by any other node are fused
//! away.

use crate::graph::{BinaryOp, Datatype, Graph, Op, UnaryOp};

/// Applies the rewrites.
pub(crate) fn fuse(g: &mut Graph) {
    fuse_clamps(g);
    fuse_silu(g);
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
            && !pn.fused_silu
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

/// SiLU as one node, and into its producer (see the module docs).
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
        // Into the producer's epilogue.
        let Some(p) = producer.get(x).copied().flatten() else {
            continue;
        };
        let Some(pn) = g.nodes.get(p) else { continue };
        let fusable = matches!(
            pn.op,
            Op::Conv2d(_) | Op::DepthwiseConv2d(_) | Op::FullyConnected { .. }
        ) && unbounded(pn.min, pn.max)
            && !pn.fused_silu
            && readers.get(x) == Some(&1)
            && pn
                .inputs
                .iter()
                .flatten()
                .all(|&i| g.values.get(i).is_some_and(|v| v.dtype.is_float()));
        if fusable {
            if let Some(pn) = g.nodes.get_mut(p) {
                pn.outputs = [out].into_iter().collect();
                pn.fused_silu = true;
            }
            if let Some(r) = removed.get_mut(m) {
                *r = true;
            }
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
        assert!(g.nodes[1].fused_silu && !g.nodes[2].fused_silu);
        // The linear layer's SiLU into it; the input's SiLU stays a node.
        let mut g = Graph::summary(&p[1]).unwrap();
        fuse(&mut g);
        let mut k = kinds(&g);
        k.sort_unstable();
        assert_eq!(k, ["FullyConnected", "Sigmoid+Multiply"]);
        assert!(g.nodes.iter().any(|n| n.fused_silu));
    }
}
