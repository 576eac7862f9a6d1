//! Functional operators to their `.out` variants (upstream's `ToOutVarPass`): each node
//! gets its outputs appended as the out arguments, so that every tensor it writes is
//! memory the planner placed. Operators without tensors to write (symbolic sizes, prim
//! arithmetic, control flow) are left as they are.

use crate::error::{CompileError, Result};
use crate::import::Program;
use crate::ir::Arg;
use crate::passes::decompose::has_kernel;
use crate::passes::{Action, Rewriter};
use crate::schema::{self, Ty};

/// Runs the pass.
pub fn run(p: &mut Program) -> Result<()> {
    Rewriter::run(p, &mut |_, mut node| {
        let Some(s) = schema::lookup(&node.op) else {
            return Ok(Action::Keep(node));
        };
        let Some(out) = s.out.as_deref() else {
            return Ok(Action::Keep(node));
        };
        if !has_kernel(&out.op.key()) {
            return Err(CompileError::NoDecomposition {
                ops: vec![out.op.key()],
            });
        }
        let outs: Vec<_> = out.args.iter().skip(out.num_inputs()).collect();
        // The out variant's inputs, matched by name (`_to_dim_order_copy.out` drops the
        // functional form's dtype, layout and device), then the outputs.
        let mut args = Vec::with_capacity(out.args.len());
        for oa in out.args.iter().take(out.num_inputs()) {
            let a = match s.index_of(&oa.name).and_then(|i| node.args.get(i)) {
                Some(a) => a.clone(),
                None => oa.default.clone().ok_or_else(|| {
                    CompileError::invalid(out.op.key(), format!("no value for {}", oa.name))
                })?,
            };
            args.push(a);
        }
        node.args = args;
        match outs.as_slice() {
            [single] if matches!(single.ty, Ty::List(..)) => {
                node.args.push(Arg::Tensors(node.outputs.clone()))
            }
            _ => {
                if outs.len() != node.outputs.len() {
                    return Err(CompileError::invalid(
                        node.op.key(),
                        format!(
                            "{} outputs for {} out arguments",
                            node.outputs.len(),
                            outs.len()
                        ),
                    ));
                }
                node.args
                    .extend(node.outputs.iter().map(|&v| Arg::Tensor(v)));
            }
        }
        node.op = out.op.clone();
        Ok(Action::Keep(node))
    })
}
