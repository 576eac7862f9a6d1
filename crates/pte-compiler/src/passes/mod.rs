//! The passes between import and emission, each a function over [`Program`]:
//! [`functionalize`], [`decompose`], [`edge`], [`out_variant`], then [`plan`].
//!
//! [`Rewriter`] is the loop most passes share: it walks the nodes (into control-flow
//! blocks), lets the pass keep a node or replace it with new ones, and substitutes the
//! values a replaced node defined in everything after it.

pub mod decompose;
pub mod edge;
pub mod functionalize;
pub mod infer;
pub mod out_variant;
pub mod plan;

use std::collections::HashMap;

use crate::archive::TensorData;
use crate::error::{CompileError, Result};
use crate::import::{InputKind, Program};
use crate::ir::{Arg, Node, Op, TensorMeta, ValueId, ValueKind};

/// What a pass does with a node.
pub enum Action {
    /// Keep it (possibly changed).
    Keep(Node),
    /// It was replaced: its outputs are now these values.
    Replaced(Vec<ValueId>),
}

/// Builds the new node list of a pass.
pub struct Rewriter<'a> {
    /// The program (for values and constants).
    pub p: &'a mut Program,
    subst: HashMap<ValueId, ValueId>,
    out: Vec<Node>,
    depth: usize,
}

/// Appends the schema defaults of the arguments a pass left out, so that every node has
/// all of its operator's arguments.
pub fn fill_defaults(op: &Op, args: &mut Vec<Arg>) -> Result<()> {
    let Some(s) = crate::schema::lookup(op) else {
        return Ok(());
    };
    if args.len() > s.args.len() {
        return Err(CompileError::invalid(
            op.key(),
            format!("{} arguments for {}", args.len(), s.args.len()),
        ));
    }
    for sa in s.args.iter().skip(args.len()) {
        let d = sa.default.clone().ok_or_else(|| {
            CompileError::invalid(op.key(), format!("argument {} has no default", sa.name))
        })?;
        args.push(d);
    }
    Ok(())
}

/// Deepest recursion of decompositions into decompositions.
const MAX_DEPTH: usize = 32;

impl<'a> Rewriter<'a> {
    /// Runs `f` on every node of the program, blocks included.
    pub fn run(
        p: &'a mut Program,
        f: &mut dyn FnMut(&mut Rewriter<'_>, Node) -> Result<Action>,
    ) -> Result<()> {
        let nodes = std::mem::take(&mut p.graph.nodes);
        let mut rw = Rewriter {
            p,
            subst: HashMap::new(),
            out: Vec::new(),
            depth: 0,
        };
        rw.nodes(nodes, f)?;
        let mut outputs = std::mem::take(&mut rw.p.graph.outputs);
        for a in &mut outputs {
            rw.map_arg(a);
        }
        rw.p.graph.outputs = outputs;
        rw.p.graph.nodes = std::mem::take(&mut rw.out);
        rw.p.graph.remove_dead_nodes();
        Ok(())
    }

    fn nodes(
        &mut self,
        nodes: Vec<Node>,
        f: &mut dyn FnMut(&mut Rewriter<'_>, Node) -> Result<Action>,
    ) -> Result<()> {
        for mut node in nodes {
            for a in &mut node.args {
                if let Arg::Block(b) = a {
                    let saved = std::mem::take(&mut self.out);
                    let inner = std::mem::take(&mut b.nodes);
                    self.nodes(inner, f)?;
                    b.nodes = std::mem::replace(&mut self.out, saved);
                    for o in &mut b.outputs {
                        self.map_arg(o);
                    }
                } else {
                    self.map_arg(a);
                }
            }
            let outs = node.outputs.clone();
            match f(self, node)? {
                Action::Keep(n) => self.out.push(n),
                Action::Replaced(new) => {
                    for (old, new) in outs.into_iter().zip(new) {
                        if old != new {
                            self.subst.insert(old, new);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn map_arg(&self, a: &mut Arg) {
        a.map_values(&mut |v| self.resolve(v));
    }

    /// The value that now stands for `v`.
    pub fn resolve(&self, mut v: ValueId) -> ValueId {
        // Substitutions point from old values to newer ones; the bound is a guard.
        for _ in 0..=self.subst.len() {
            match self.subst.get(&v) {
                Some(&n) => v = n,
                None => break,
            }
        }
        v
    }

    /// The tensor description of a value.
    pub fn meta(&self, v: ValueId) -> Result<TensorMeta> {
        self.p.graph.meta(v).cloned().ok_or_else(|| {
            CompileError::invalid(self.p.graph.name(v).to_owned(), "expected a tensor")
        })
    }

    /// Appends a node as it is.
    pub fn push(&mut self, node: Node) {
        self.out.push(node);
    }

    /// Appends a call with outputs described by `kinds`, returning the new values.
    pub fn emit(
        &mut self,
        op: Op,
        args: Vec<Arg>,
        name: &str,
        kinds: Vec<ValueKind>,
    ) -> Vec<ValueId> {
        let outputs: Vec<ValueId> = kinds
            .into_iter()
            .map(|k| self.p.graph.add_value(name, k))
            .collect();
        self.out.push(Node {
            op,
            args,
            outputs: outputs.clone(),
        });
        outputs
    }

    /// Calls `op` (`aten::name.overload`) with outputs inferred by [`infer`]; an operator
    /// that is not core is decomposed in turn.
    pub fn call(&mut self, op: &str, mut args: Vec<Arg>) -> Result<Vec<ValueId>> {
        let op = Op::parse(op);
        fill_defaults(&op, &mut args)?;
        if self.depth > MAX_DEPTH {
            return Err(CompileError::unsupported(
                op.key(),
                "decompositions nest too deeply",
            ));
        }
        let metas = infer::infer(self, &op, &args)?;
        let name = op.short().trim_end_matches("_copy").to_owned();
        let kinds: Vec<ValueKind> = metas.into_iter().map(ValueKind::Tensor).collect();
        if let Some(d) = decompose::rule(&op) {
            let outputs: Vec<ValueId> = kinds
                .iter()
                .map(|k| self.p.graph.add_value(&name, k.clone()))
                .collect();
            let node = Node { op, args, outputs };
            self.depth += 1;
            let r = d(self, &node);
            self.depth -= 1;
            return r;
        }
        Ok(self.emit(op, args, &name, kinds))
    }

    /// [`Rewriter::call`] for an operator with one output.
    pub fn call1(&mut self, op: &str, args: Vec<Arg>) -> Result<ValueId> {
        let outs = self.call(op, args)?;
        outs.first()
            .copied()
            .ok_or_else(|| CompileError::invalid(op, "operator has no output"))
    }

    /// Adds a constant tensor (an input of the method holding data), returning its value.
    pub fn constant(&mut self, name: &str, data: TensorData) -> ValueId {
        let meta = TensorMeta::contiguous(
            data.dtype,
            data.sizes
                .iter()
                .map(|&s| crate::ir::Dim::Const(s))
                .collect(),
        );
        let id = self.p.graph.add_value(name, ValueKind::Tensor(meta));
        self.p.graph.inputs.push(id);
        let fqn = self.p.graph.name(id).to_owned();
        self.p.input_kinds.push(InputKind::Constant(fqn));
        self.p.constants.insert(id, data);
        id
    }
}
