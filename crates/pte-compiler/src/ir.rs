//! The one graph representation every pass works on.
//!
//! A [`Graph`] is a list of [`Node`]s in execution order over SSA [`Value`]s. A node calls an
//! operator whose schema is known ([`crate::schema`]); its arguments are stored positionally,
//! one per schema argument, with defaults filled in, so passes read them by index. Control
//! flow (`torch.cond`) keeps its branches as nested graphs inside the node's arguments.

use std::fmt;

use crate::dtype::DType;
use crate::sym::Expr;

/// Index of a value in its graph.
pub type ValueId = usize;

/// One dimension of a tensor: a number, or an expression over the program's symbols
/// (`s0`, `2*s0`, ...) with a range from the archive.
#[derive(Clone, Debug, PartialEq)]
pub enum Dim {
    /// Known at compile time.
    Const(i64),
    /// Known at run time only.
    Sym(Expr),
}

impl Dim {
    /// The number, when the dimension is static.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            Dim::Const(v) => Some(*v),
            Dim::Sym(e) => e.as_const(),
        }
    }

    /// A dimension from an expression, folded to a number when it has no symbols.
    pub fn from_expr(e: Expr) -> Dim {
        match e.as_const() {
            Some(v) => Dim::Const(v),
            None => Dim::Sym(e),
        }
    }

    /// The dimension as an expression.
    pub fn to_expr(&self) -> Expr {
        match self {
            Dim::Const(v) => Expr::Const(*v),
            Dim::Sym(e) => e.clone(),
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(v) => write!(f, "{v}"),
            Dim::Sym(e) => write!(f, "{e}"),
        }
    }
}

/// What a tensor value looks like.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: DType,
    /// Sizes (the upper bounds decide the memory a dynamic tensor gets).
    pub sizes: Vec<Dim>,
    /// Dimension order, outermost first (`[0, 1, 2, 3]` contiguous, `[0, 2, 3, 1]` channels
    /// last).
    pub dim_order: Vec<u8>,
}

impl TensorMeta {
    /// A contiguous tensor.
    pub fn contiguous(dtype: DType, sizes: Vec<Dim>) -> Self {
        let dim_order = (0..sizes.len() as u8).collect();
        TensorMeta {
            dtype,
            sizes,
            dim_order,
        }
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    /// Static sizes, when every dimension is known.
    pub fn static_sizes(&self) -> Option<Vec<i64>> {
        self.sizes.iter().map(Dim::as_const).collect()
    }

    /// True when some dimension is only known at run time.
    pub fn is_dynamic(&self) -> bool {
        self.sizes.iter().any(|d| d.as_const().is_none())
    }
}

/// The kind and description of a value.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind {
    /// A tensor.
    Tensor(TensorMeta),
    /// A symbolic integer (a size read at run time, or arithmetic on sizes).
    SymInt(Expr),
    /// A symbolic float.
    SymFloat,
    /// A symbolic bool.
    SymBool,
    /// A value nothing reads (an unused output).
    Unused,
}

/// One SSA value.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// Name, unique in the graph (from the archive, or made up by a pass).
    pub name: String,
    /// What it is.
    pub kind: ValueKind,
}

impl Value {
    /// The tensor description, if the value is a tensor.
    pub fn tensor(&self) -> Option<&TensorMeta> {
        match &self.kind {
            ValueKind::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// An element of an int list: a number or a symbolic integer value.
#[derive(Clone, Debug, PartialEq)]
pub enum IntArg {
    /// A number.
    Const(i64),
    /// A SymInt value of the graph.
    Sym(ValueId),
}

/// One argument of a node (or an output of a graph).
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// `None`.
    None,
    /// A tensor value.
    Tensor(ValueId),
    /// A list of tensors.
    Tensors(Vec<ValueId>),
    /// A list of optional tensors.
    OptTensors(Vec<Option<ValueId>>),
    /// An integer.
    Int(i64),
    /// A symbolic integer value.
    SymInt(ValueId),
    /// An int list (sizes may be symbolic).
    Ints(Vec<IntArg>),
    /// A float.
    Float(f64),
    /// A symbolic float value.
    SymFloat(ValueId),
    /// A float list.
    Floats(Vec<f64>),
    /// A bool.
    Bool(bool),
    /// A symbolic bool value.
    SymBool(ValueId),
    /// A bool list.
    Bools(Vec<bool>),
    /// A string.
    Str(String),
    /// A dtype.
    ScalarType(DType),
    /// A memory format (PyTorch's enum: 0 contiguous, 1 preserve, 2 channels last, 3 channels
    /// last 3d), as ExecuTorch's emitter writes it.
    MemoryFormat(i64),
    /// A layout (0 strided).
    Layout(i64),
    /// A device (only CPU is accepted).
    Device,
    /// A nested block of nodes (a branch of `torch.cond`), over the same values.
    Block(Box<Block>),
}

impl Arg {
    /// The tensor value, if this is a tensor argument.
    pub fn tensor(&self) -> Option<ValueId> {
        match self {
            Arg::Tensor(v) => Some(*v),
            _ => None,
        }
    }

    /// The integer, if this is a constant integer.
    pub fn int(&self) -> Option<i64> {
        match self {
            Arg::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The constant ints, if this is an int list without symbols.
    pub fn ints(&self) -> Option<Vec<i64>> {
        match self {
            Arg::Ints(v) => v
                .iter()
                .map(|i| match i {
                    IntArg::Const(c) => Some(*c),
                    IntArg::Sym(_) => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// The number as f64 for Int, Float and Bool constants.
    pub fn number(&self) -> Option<f64> {
        match self {
            Arg::Int(v) => Some(*v as f64),
            Arg::Float(v) => Some(*v),
            Arg::Bool(b) => Some(f64::from(u8::from(*b))),
            _ => None,
        }
    }

    /// The bool, if this is a constant bool.
    pub fn bool(&self) -> Option<bool> {
        match self {
            Arg::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Every value this argument reads.
    pub fn values(&self, out: &mut Vec<ValueId>) {
        match self {
            Arg::Tensor(v) | Arg::SymInt(v) | Arg::SymFloat(v) | Arg::SymBool(v) => out.push(*v),
            Arg::Tensors(vs) => out.extend(vs),
            Arg::OptTensors(vs) => out.extend(vs.iter().flatten()),
            Arg::Ints(vs) => out.extend(vs.iter().filter_map(|i| match i {
                IntArg::Sym(v) => Some(*v),
                IntArg::Const(_) => None,
            })),
            _ => {}
        }
    }

    /// Rewrites every value this argument reads.
    pub fn map_values(&mut self, f: &mut impl FnMut(ValueId) -> ValueId) {
        match self {
            Arg::Tensor(v) | Arg::SymInt(v) | Arg::SymFloat(v) | Arg::SymBool(v) => *v = f(*v),
            Arg::Tensors(vs) => vs.iter_mut().for_each(|v| *v = f(*v)),
            Arg::OptTensors(vs) => vs.iter_mut().flatten().for_each(|v| *v = f(*v)),
            Arg::Ints(vs) => vs.iter_mut().for_each(|i| {
                if let IntArg::Sym(v) = i {
                    *v = f(*v);
                }
            }),
            _ => {}
        }
    }
}

/// The operator a node calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    /// Qualified name, e.g. `aten::add`.
    pub name: String,
    /// Overload, e.g. `Tensor`; empty for the default overload.
    pub overload: String,
}

impl Op {
    /// An operator from its parts.
    pub fn new(name: &str, overload: &str) -> Self {
        Op {
            name: name.to_owned(),
            overload: overload.to_owned(),
        }
    }

    /// Parses `aten::add.Tensor` (or `aten::relu` for the default overload).
    pub fn parse(qualified: &str) -> Self {
        let (ns, rest) = qualified.split_once("::").unwrap_or(("aten", qualified));
        let (name, overload) = rest.split_once('.').unwrap_or((rest, ""));
        let overload = if overload == "default" { "" } else { overload };
        Op {
            name: format!("{ns}::{name}"),
            overload: overload.to_owned(),
        }
    }

    /// `name.overload`, or `name` for the default overload: the key of the schema table and
    /// of kernel registries.
    pub fn key(&self) -> String {
        if self.overload.is_empty() {
            self.name.clone()
        } else {
            format!("{}.{}", self.name, self.overload)
        }
    }

    /// The name without namespace.
    pub fn short(&self) -> &str {
        self.name.split_once("::").map_or(&self.name, |(_, n)| n)
    }

    /// True for `higher_order::cond`.
    pub fn is_cond(&self) -> bool {
        self.name == "higher_order::cond"
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// One operator call.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The operator.
    pub op: Op,
    /// Arguments in schema order (all of them, defaults included).
    pub args: Vec<Arg>,
    /// Values the node defines, flattened (a `Tensor[]` return gives several).
    pub outputs: Vec<ValueId>,
}

/// A branch of a control-flow node: nodes over the enclosing graph's values (its inputs are
/// the node's operands), and what it returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// What the block returns, one per output of the control-flow node.
    pub outputs: Vec<Arg>,
}

/// A graph: values, nodes in execution order, inputs and outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// Every value.
    pub values: Vec<Value>,
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Values bound from outside: the placeholders.
    pub inputs: Vec<ValueId>,
    /// What the graph returns (values, or constants for prim outputs).
    pub outputs: Vec<Arg>,
}

impl Graph {
    /// Adds a value with a name unique in the graph (a suffix is added when taken).
    pub fn add_value(&mut self, name: &str, kind: ValueKind) -> ValueId {
        let id = self.values.len();
        let name = if self.values.iter().any(|v| v.name == name) {
            format!("{name}_{id}")
        } else {
            name.to_owned()
        };
        self.values.push(Value { name, kind });
        id
    }

    /// The value with this id.
    pub fn value(&self, id: ValueId) -> Option<&Value> {
        self.values.get(id)
    }

    /// The tensor description of a value, if it is a tensor.
    pub fn meta(&self, id: ValueId) -> Option<&TensorMeta> {
        self.values.get(id).and_then(Value::tensor)
    }

    /// The name of a value (for messages).
    pub fn name(&self, id: ValueId) -> &str {
        self.values.get(id).map_or("?", |v| v.name.as_str())
    }

    /// How many times each value is read (by nodes, nested graphs' operands and outputs).
    pub fn use_counts(&self) -> Vec<usize> {
        fn visit(nodes: &[Node], outputs: &[Arg], used: &mut Vec<ValueId>) {
            for node in nodes {
                for a in &node.args {
                    match a {
                        Arg::Block(b) => visit(&b.nodes, &b.outputs, used),
                        a => a.values(used),
                    }
                }
            }
            for a in outputs {
                a.values(used);
            }
        }
        let mut counts = vec![0; self.values.len()];
        let mut used = Vec::new();
        visit(&self.nodes, &self.outputs, &mut used);
        for v in used {
            if let Some(c) = counts.get_mut(v) {
                *c += 1;
            }
        }
        counts
    }
}

impl Graph {
    /// Appends a node whose outputs are new values, returning their ids.
    pub fn push(
        &mut self,
        op: Op,
        args: Vec<Arg>,
        outputs: Vec<(String, ValueKind)>,
    ) -> Vec<ValueId> {
        let ids: Vec<ValueId> = outputs
            .into_iter()
            .map(|(name, kind)| self.add_value(&name, kind))
            .collect();
        self.nodes.push(Node {
            op,
            args,
            outputs: ids.clone(),
        });
        ids
    }

    /// Appends a node with one tensor output.
    pub fn push1(&mut self, op: Op, args: Vec<Arg>, name: &str, meta: TensorMeta) -> ValueId {
        let ids = self.push(op, args, vec![(name.to_owned(), ValueKind::Tensor(meta))]);
        ids.first().copied().unwrap_or_default()
    }

    /// Removes nodes whose outputs nothing reads (every node of a functional graph is free
    /// of side effects), repeatedly.
    pub fn remove_dead_nodes(&mut self) {
        fn prune(nodes: &mut Vec<Node>, uses: &[usize]) -> usize {
            let before = nodes.len();
            nodes.retain(|n| {
                n.op.is_cond()
                    || n.outputs.is_empty()
                    || n.outputs
                        .iter()
                        .any(|&o| uses.get(o).copied().unwrap_or(0) > 0)
            });
            let mut removed = before - nodes.len();
            for n in nodes.iter_mut() {
                for a in &mut n.args {
                    if let Arg::Block(b) = a {
                        removed += prune(&mut b.nodes, uses);
                    }
                }
            }
            removed
        }
        loop {
            let uses = self.use_counts();
            if prune(&mut self.nodes, &uses) == 0 {
                return;
            }
        }
    }
}
