//! Prints a program's graph in the readable style of PyTorch's printed `ExportedProgram`:
//!
//! ```text
//! ExportedProgram:
//!   class GraphModule(torch.nn.Module):
//!     def forward(self, p_linear_weight: "f32[5, 4]", x: "f32[3, 4]"):
//!       permute: "f32[4, 5]" = torch.ops.aten.permute_copy.default(p_linear_weight, [1, 0])
//!       ...
//!       return (clamp,)
//! ```
//!
//! After memory planning each planned tensor also shows its arena offset (`@64`).

use std::fmt::Write;

use crate::dtype;
use crate::import::{InputKind, OutputKind, Program};
use crate::ir::{Arg, Graph, IntArg, Node, ValueId, ValueKind};
use crate::passes::plan::MemoryPlan;

fn ty(g: &Graph, v: ValueId, plan: Option<&MemoryPlan>) -> String {
    let Some(val) = g.value(v) else {
        return "?".into();
    };
    let mut s = match &val.kind {
        ValueKind::Tensor(m) => {
            let sizes: Vec<String> = m.sizes.iter().map(ToString::to_string).collect();
            format!("{}[{}]", dtype::short_name(m.dtype), sizes.join(", "))
        }
        ValueKind::SymInt(e) => format!("Sym({e})"),
        ValueKind::SymFloat => "SymFloat".into(),
        ValueKind::SymBool => "SymBool".into(),
        ValueKind::Unused => "unused".into(),
    };
    if let Some(off) = plan.and_then(|p| p.offsets.get(&v)) {
        let _ = write!(s, "@{off}");
    }
    s
}

fn arg(g: &Graph, a: &Arg) -> String {
    let list = |items: Vec<String>| format!("[{}]", items.join(", "));
    match a {
        Arg::None => "None".into(),
        Arg::Tensor(v) | Arg::SymInt(v) | Arg::SymFloat(v) | Arg::SymBool(v) => {
            g.name(*v).to_owned()
        }
        Arg::Tensors(vs) => list(vs.iter().map(|&v| g.name(v).to_owned()).collect()),
        Arg::OptTensors(vs) => list(
            vs.iter()
                .map(|v| v.map_or("None".into(), |v| g.name(v).to_owned()))
                .collect(),
        ),
        Arg::Int(i) => i.to_string(),
        Arg::Ints(is) => list(
            is.iter()
                .map(|i| match i {
                    IntArg::Const(c) => c.to_string(),
                    IntArg::Sym(v) => g.name(*v).to_owned(),
                })
                .collect(),
        ),
        Arg::Float(f) => format!("{f:?}"),
        Arg::Floats(fs) => list(fs.iter().map(|f| format!("{f:?}")).collect()),
        Arg::Bool(b) => {
            if *b {
                "True".into()
            } else {
                "False".into()
            }
        }
        Arg::Bools(bs) => list(
            bs.iter()
                .map(|b| if *b { "True".into() } else { "False".into() })
                .collect(),
        ),
        Arg::Str(s) => format!("{s:?}"),
        Arg::ScalarType(d) => format!("torch.{}", pte_format::scalar::dtype_name(*d)),
        Arg::MemoryFormat(m) => format!("memory_format({m})"),
        Arg::Layout(_) => "torch.strided".into(),
        Arg::Device => "cpu".into(),
        Arg::Block(_) => "<block>".into(),
    }
}

fn node(out: &mut String, g: &Graph, n: &Node, indent: &str, plan: Option<&MemoryPlan>) {
    let lhs: Vec<String> = n
        .outputs
        .iter()
        .map(|&o| format!("{}: \"{}\"", g.name(o), ty(g, o, plan)))
        .collect();
    let lhs = match lhs.len() {
        0 => String::new(),
        1 => format!("{} = ", lhs.join("")),
        _ => format!("({}) = ", lhs.join(", ")),
    };
    let target = format!(
        "torch.ops.{}.{}",
        n.op.name.replace("::", "."),
        if n.op.overload.is_empty() {
            "default"
        } else {
            &n.op.overload
        }
    );
    let args: Vec<String> = n
        .args
        .iter()
        .filter(|a| !matches!(a, Arg::Block(_)))
        .map(|a| arg(g, a))
        .collect();
    let _ = writeln!(out, "{indent}{lhs}{target}({})", args.join(", "));
    for (i, a) in n.args.iter().enumerate() {
        if let Arg::Block(b) = a {
            let label = if i == 1 {
                "true branch"
            } else {
                "false branch"
            };
            let _ = writeln!(out, "{indent}  # {label}:");
            for bn in &b.nodes {
                node(out, g, bn, &format!("{indent}    "), plan);
            }
            let rets: Vec<String> = b.outputs.iter().map(|a| arg(g, a)).collect();
            let _ = writeln!(out, "{indent}    return ({},)", rets.join(", "));
        }
    }
}

/// The program as text, with planned offsets when a plan is given.
pub fn program(p: &Program, plan: Option<&MemoryPlan>) -> String {
    let g = &p.graph;
    let mut out = String::from("ExportedProgram:\n  class GraphModule(torch.nn.Module):\n");
    let params: Vec<String> = g
        .inputs
        .iter()
        .map(|&v| format!("{}: \"{}\"", g.name(v), ty(g, v, plan)))
        .collect();
    let _ = writeln!(out, "    def {}(self, {}):", p.name, params.join(", "));
    for n in &g.nodes {
        node(&mut out, g, n, "      ", plan);
    }
    let rets: Vec<String> = g.outputs.iter().map(|a| arg(g, a)).collect();
    let _ = writeln!(out, "      return ({},)\n", rets.join(", "));
    out.push_str("Graph signature:\n    # inputs\n");
    for (&v, k) in g.inputs.iter().zip(&p.input_kinds) {
        let kind = match k {
            InputKind::User => "USER_INPUT".to_owned(),
            InputKind::Parameter(f) => format!("PARAMETER target='{f}'"),
            InputKind::Buffer(f) => format!("BUFFER target='{f}'"),
            InputKind::Constant(f) => format!("CONSTANT_TENSOR target='{f}'"),
            InputKind::Literal(a) => format!("USER_INPUT specialised to {}", arg(g, a)),
        };
        let _ = writeln!(out, "    {}: {kind}", g.name(v));
    }
    out.push_str("\n    # outputs\n");
    for (a, k) in g.outputs.iter().zip(&p.output_kinds) {
        let kind = match k {
            OutputKind::User => "USER_OUTPUT".to_owned(),
            OutputKind::BufferMutation(f) => format!("BUFFER_MUTATION target='{f}'"),
            OutputKind::UserInputMutation(f) => format!("USER_INPUT_MUTATION target='{f}'"),
        };
        let _ = writeln!(out, "    {}: {kind}", arg(g, a));
    }
    let ranges: Vec<String> = p
        .ranges
        .iter()
        .map(|(s, (lo, hi))| {
            let f = |v: &Option<i64>| v.map_or("inf".into(), |v| v.to_string());
            format!("{s}: VR[{}, {}]", f(lo), f(hi))
        })
        .collect();
    let _ = writeln!(out, "\nRange constraints: {{{}}}", ranges.join(", "));
    if let Some(plan) = plan {
        let _ = writeln!(
            out,
            "Planned memory: {} bytes (upstream's greedy algorithm: {} bytes)",
            plan.total, plan.upstream_greedy_total
        );
    }
    out
}
