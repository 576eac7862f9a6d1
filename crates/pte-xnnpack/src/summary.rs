//! What `pte inspect` shows of an XNNPACK payload: node kinds with counts, value
//! datatypes with counts, constant bytes.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::graph::Graph;

/// A summary of one XNNPACK delegate payload.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// The flatbuffer identifier (`XN00` or `XN01`).
    pub identifier: String,
    /// Whether the payload starts with an `XH00` header.
    pub header: bool,
    pub num_nodes: usize,
    /// Node kinds (the schema's names) and how many nodes of each.
    pub nodes: BTreeMap<String, usize>,
    pub num_values: usize,
    /// Value datatypes (upstream's names) and how many values of each.
    pub datatypes: BTreeMap<String, usize>,
    /// Values that are constants, and the bytes of constant data they reference.
    pub constants: usize,
    pub constant_bytes: u64,
    /// Graph inputs and outputs.
    pub inputs: usize,
    pub outputs: usize,
}

/// Parses and validates a payload (without resolving named constant data) and
/// summarizes it.
pub fn summarize(payload: &[u8]) -> Result<Summary> {
    let g = Graph::summary(payload)?;
    let mut s = Summary {
        identifier: String::from_utf8_lossy(&g.identifier).into_owned(),
        header: g.has_header,
        num_nodes: g.nodes.len(),
        num_values: g.values.len(),
        inputs: g.inputs.len(),
        outputs: g.outputs.len(),
        constant_bytes: g.constant_bytes,
        ..Summary::default()
    };
    for n in &g.nodes {
        *s.nodes.entry(n.kind.to_owned()).or_default() += 1;
    }
    for v in &g.values {
        *s.datatypes.entry(v.dtype.name().to_owned()).or_default() += 1;
        if v.data.is_some() {
            s.constants += 1;
        }
    }
    Ok(s)
}
