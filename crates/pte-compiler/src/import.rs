//! From an archive's exported program to the compiler's [`Graph`], with the program's
//! signature, weights and symbol ranges ([`Program`]).
//!
//! Arguments are matched to the operator's schema by name, defaults are filled in, and
//! values are typed by the schema (a Python int given for a `Scalar` stays an int, a list
//! of sizes mixing numbers and symbols becomes an [`Arg::Ints`]).

use std::collections::{BTreeMap, HashMap};

use crate::archive::{json, Model, TensorData};
use crate::dtype;
use crate::error::{CompileError, Result};
use crate::ir::{Arg, Block, Dim, Graph, IntArg, Node, Op, TensorMeta, ValueId, ValueKind};
use crate::schema::{self, Ty};
use crate::sym::{Expr, Ranges};

/// Deepest nesting of control-flow graphs accepted.
const MAX_GRAPH_DEPTH: usize = 16;

/// What a graph input is.
#[derive(Clone, Debug, PartialEq)]
pub enum InputKind {
    /// Given by the caller.
    User,
    /// A parameter (fully qualified name).
    Parameter(String),
    /// A buffer (fully qualified name).
    Buffer(String),
    /// A lifted tensor constant (name).
    Constant(String),
    /// A number or flag given by the caller but specialised at export: the caller must
    /// pass exactly this value.
    Literal(Arg),
}

/// What a graph output is.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputKind {
    /// Returned to the caller.
    User,
    /// The new value of a buffer (fully qualified name).
    BufferMutation(String),
    /// The new value of a user input (its name).
    UserInputMutation(String),
}

/// One method to compile: its graph, signature, data and symbol ranges.
#[derive(Clone, Debug)]
pub struct Program {
    /// The method name (`forward` for a single-program archive).
    pub name: String,
    /// The graph.
    pub graph: Graph,
    /// Parallel to `graph.inputs`.
    pub input_kinds: Vec<InputKind>,
    /// Parallel to `graph.outputs`.
    pub output_kinds: Vec<OutputKind>,
    /// Data of parameter, buffer and constant inputs (and of constants passes create).
    pub constants: HashMap<ValueId, TensorData>,
    /// Ranges of the dimension symbols.
    pub ranges: Ranges,
    /// The pytree specs of inputs and outputs, as the archive records them.
    pub in_spec: String,
    /// See `in_spec`.
    pub out_spec: String,
}

impl Program {
    /// Every input kind that names a buffer the graph mutates.
    pub fn mutated_buffers(&self) -> Vec<String> {
        self.output_kinds
            .iter()
            .filter_map(|k| match k {
                OutputKind::BufferMutation(n) => Some(n.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Imports one exported program as the method `method`, taking its tensors.
pub fn import(model: &mut Model, method: &str) -> Result<Program> {
    let ep = &model.program;
    let mut ranges = Ranges::new();
    for (sym, r) in &ep.range_constraints {
        // torch writes infinite bounds as None or as huge numbers.
        let bound = |v: Option<i64>| v.filter(|v| v.abs() < (1 << 62));
        ranges.insert(sym.clone(), (bound(r.min_val), bound(r.max_val)));
    }
    let gm = &ep.graph_module;
    let mut graph = import_graph(&gm.graph)?;

    let sig = &gm.signature;
    if sig.input_specs.len() != graph.inputs.len() {
        return Err(CompileError::invalid(
            "graph_signature.input_specs",
            format!(
                "{} specs for {} inputs",
                sig.input_specs.len(),
                graph.inputs.len()
            ),
        ));
    }
    let mut input_kinds = Vec::new();
    let mut constants = HashMap::new();
    for (i, spec) in sig.input_specs.iter().enumerate() {
        let field = format!("graph_signature.input_specs[{i}]");
        let value = *graph.inputs.get(i).unwrap_or(&usize::MAX);
        let (kind, data) = match spec {
            json::InputSpec::UserInput { .. } => (InputKind::User, None),
            json::InputSpec::Parameter { parameter_name, .. } => (
                InputKind::Parameter(parameter_name.clone()),
                model.weights.remove(parameter_name),
            ),
            json::InputSpec::Buffer { buffer_name, .. } => (
                InputKind::Buffer(buffer_name.clone()),
                model.weights.remove(buffer_name),
            ),
            json::InputSpec::TensorConstant {
                tensor_constant_name,
                ..
            } => (
                InputKind::Constant(tensor_constant_name.clone()),
                model.constants.remove(tensor_constant_name),
            ),
            json::InputSpec::CustomObj(_) => {
                return Err(CompileError::unsupported(
                    field,
                    "custom objects (torchbind) as inputs",
                ))
            }
            json::InputSpec::Token(_) => {
                return Err(CompileError::unsupported(field, "effect tokens"))
            }
            json::InputSpec::ConstantInput { value, .. } => (
                InputKind::Literal(match value {
                    json::ConstantValue::AsInt(v) => Arg::Int(*v),
                    json::ConstantValue::AsFloat(f) => Arg::Float(f.0),
                    json::ConstantValue::AsBool(b) => Arg::Bool(*b),
                    json::ConstantValue::AsString(s) => Arg::Str(s.clone()),
                    json::ConstantValue::AsNone(_) => Arg::None,
                }),
                None,
            ),
        };
        if matches!(
            kind,
            InputKind::Parameter(_) | InputKind::Buffer(_) | InputKind::Constant(_)
        ) {
            let data = data.ok_or_else(|| {
                CompileError::invalid(&field, "the archive has no data for this input")
            })?;
            let meta = graph
                .meta(value)
                .ok_or_else(|| CompileError::invalid(&field, "not a tensor"))?;
            if meta.static_sizes().as_deref() != Some(data.sizes.as_slice())
                || meta.dtype != data.dtype
            {
                return Err(CompileError::invalid(
                    &field,
                    format!(
                        "the stored tensor ({:?} {:?}) does not match the graph's {:?}",
                        data.dtype, data.sizes, meta
                    ),
                ));
            }
            constants.insert(value, data);
        }
        input_kinds.push(kind);
    }
    let mut output_kinds = Vec::new();
    for (i, spec) in sig.output_specs.iter().enumerate() {
        let field = format!("graph_signature.output_specs[{i}]");
        output_kinds.push(match spec {
            json::OutputSpec::UserOutput { .. } => OutputKind::User,
            json::OutputSpec::BufferMutation { buffer_name, .. } => {
                OutputKind::BufferMutation(buffer_name.clone())
            }
            json::OutputSpec::UserInputMutation {
                user_input_name, ..
            } => OutputKind::UserInputMutation(user_input_name.clone()),
            json::OutputSpec::ParameterMutation { .. } => {
                return Err(CompileError::unsupported(field, "mutating a parameter"))
            }
            _ => {
                return Err(CompileError::unsupported(
                    field,
                    "training outputs (loss, gradients, tokens)",
                ))
            }
        });
    }
    if output_kinds.len() != graph.outputs.len() {
        return Err(CompileError::invalid(
            "graph_signature.output_specs",
            format!(
                "{} specs for {} outputs",
                output_kinds.len(),
                graph.outputs.len()
            ),
        ));
    }
    let (in_spec, out_spec) = gm
        .module_call_graph
        .iter()
        .find(|e| e.fqn.is_empty())
        .and_then(|e| e.signature.as_ref())
        .map(|s| (s.in_spec.clone(), s.out_spec.clone()))
        .unwrap_or_default();
    // Values only a mutation output reads keep their own storage.
    graph.values.shrink_to_fit();
    Ok(Program {
        name: method.to_owned(),
        graph,
        input_kinds,
        output_kinds,
        constants,
        ranges,
        in_spec,
        out_spec,
    })
}

struct Importer<'a> {
    g: Graph,
    /// Names visible in the graph being read (a branch sees its inputs as the operands).
    names: HashMap<String, ValueId>,
    src: &'a json::Graph,
    path: String,
    depth: usize,
    /// Nodes of the graph being read.
    nodes: Vec<Node>,
}

/// Imports the top-level graph.
fn import_graph(src: &json::Graph) -> Result<Graph> {
    let mut im = Importer {
        g: Graph::default(),
        names: HashMap::new(),
        src,
        path: "graph".to_owned(),
        depth: 0,
        nodes: Vec::new(),
    };
    for (i, input) in src.inputs.iter().enumerate() {
        let id = im.define(input, &format!("graph.inputs[{i}]"))?;
        im.g.inputs.extend(id);
    }
    im.body()?;
    im.g.nodes = std::mem::take(&mut im.nodes);
    Ok(im.g)
}

fn dims(sizes: &[json::SymInt], field: &str) -> Result<Vec<Dim>> {
    sizes
        .iter()
        .map(|s| match s {
            json::SymInt::AsInt(v) if *v >= 0 => Ok(Dim::Const(*v)),
            json::SymInt::AsInt(v) => {
                Err(CompileError::invalid(field, format!("negative size {v}")))
            }
            json::SymInt::AsExpr(e) => Ok(Dim::from_expr(Expr::parse(&e.expr_str)?)),
        })
        .collect()
}

pub(crate) fn tensor_meta(tm: &json::TensorMeta, field: &str) -> Result<TensorMeta> {
    let dtype = dtype::from_export_code(tm.dtype)
        .ok_or_else(|| CompileError::unsupported(field, format!("dtype code {}", tm.dtype)))?;
    if let Some(d) = &tm.device {
        if d.kind != "cpu" {
            return Err(CompileError::unsupported(
                field,
                format!("device {:?}", d.kind),
            ));
        }
    }
    if tm.layout.is_some_and(|l| l != 7) {
        return Err(CompileError::unsupported(
            field,
            "a layout other than strided",
        ));
    }
    let sizes = dims(&tm.sizes, field)?;
    if sizes.len() > 16 {
        return Err(CompileError::invalid(
            field,
            format!("rank {} > 16", sizes.len()),
        ));
    }
    // Every value the compiled program computes is contiguous (views become copies); the
    // strides of the export are only needed to read stored weights.
    Ok(TensorMeta::contiguous(dtype, sizes))
}

/// Maps Python-level targets of symbolic integer arithmetic to ExecuTorch's prim operators.
fn python_target(target: &str) -> Option<Op> {
    let op = match target {
        "_operator.add" => "add",
        "_operator.sub" => "sub",
        "_operator.mul" => "mul",
        "_operator.floordiv" => "floordiv",
        "_operator.truediv" => "truediv",
        "_operator.mod" => "mod",
        "_operator.neg" => "neg",
        "_operator.eq" => "eq",
        "_operator.gt" => "gt",
        "_operator.ge" => "ge",
        "_operator.lt" => "lt",
        "_operator.le" => "le",
        "torch.sym_max" => "sym_max",
        "torch.sym_min" => "sym_min",
        "torch.sym_float" => "sym_float",
        "torch.sym_int" => "sym_int",
        "torch.sym_not" => "sym_not",
        "torch.sym_ite" => "sym_ite",
        "math.ceil" => "ceil",
        "math.trunc" => "trunc",
        "builtins.round" => "round",
        _ => return None,
    };
    Some(Op::new(&format!("executorch_prim::{op}"), "Scalar"))
}

fn op_of(target: &str) -> Option<Op> {
    if let Some(op) = python_target(target) {
        return Some(op);
    }
    let rest = target.strip_prefix("torch.ops.")?;
    let (ns, rest) = rest.split_once('.')?;
    if ns == "higher_order" {
        return Some(Op::new(&format!("higher_order::{rest}"), ""));
    }
    Some(Op::parse(&format!("{ns}::{rest}")))
}

impl<'a> Importer<'a> {
    /// Reads the nodes and outputs of `self.src` into `self.nodes` and `self.g.outputs`.
    fn body(&mut self) -> Result<()> {
        let src = self.src;
        for (i, node) in src.nodes.iter().enumerate() {
            self.node(node, i)?;
        }
        for (i, out) in src.outputs.iter().enumerate() {
            let field = format!("{}.outputs[{i}]", self.path);
            let arg = self.arg(out, None, &field)?;
            self.g.outputs.push(arg);
        }
        Ok(())
    }

    /// Reads a branch of a control-flow node over the same values, its inputs bound to
    /// `operands`.
    fn block(
        &mut self,
        g: &'a json::GraphArgument,
        operands: &[ValueId],
        field: &str,
    ) -> Result<Block> {
        if self.depth >= MAX_GRAPH_DEPTH {
            return Err(CompileError::invalid(
                field,
                "control flow nested too deeply",
            ));
        }
        if g.graph.inputs.len() != operands.len() {
            return Err(CompileError::invalid(
                field,
                format!(
                    "{} inputs for {} operands",
                    g.graph.inputs.len(),
                    operands.len()
                ),
            ));
        }
        let mut names = HashMap::new();
        for (input, &v) in g.graph.inputs.iter().zip(operands) {
            match input {
                json::Argument::AsTensor(t) => {
                    names.insert(t.name.clone(), v);
                }
                json::Argument::AsSymInt(json::SymIntArgument::AsName(n)) => {
                    names.insert(n.clone(), v);
                }
                other => {
                    return Err(CompileError::unsupported(
                        field,
                        format!("branch input {other:?}"),
                    ))
                }
            }
        }
        let saved_names = std::mem::replace(&mut self.names, names);
        let saved_src = std::mem::replace(&mut self.src, &g.graph);
        let path = format!("{}.{}", self.path, g.name);
        let saved_path = std::mem::replace(&mut self.path, path);
        let saved_nodes = std::mem::take(&mut self.nodes);
        let saved_outputs = std::mem::take(&mut self.g.outputs);
        self.depth += 1;
        let result = self.body();
        self.depth -= 1;
        let block = Block {
            nodes: std::mem::replace(&mut self.nodes, saved_nodes),
            outputs: std::mem::replace(&mut self.g.outputs, saved_outputs),
        };
        self.names = saved_names;
        self.src = saved_src;
        self.path = saved_path;
        result.map(|()| block)
    }

    fn field(&self, what: &str) -> String {
        format!("{}.{what}", self.path)
    }

    fn lookup(&self, name: &str, field: &str) -> Result<ValueId> {
        self.names.get(name).copied().ok_or_else(|| {
            CompileError::invalid(
                field,
                format!("value {name:?} is used before it is defined"),
            )
        })
    }

    fn new_value(&mut self, name: &str, kind: ValueKind, field: &str) -> Result<ValueId> {
        if self.names.contains_key(name) {
            return Err(CompileError::invalid(
                field,
                format!("value {name:?} is defined twice"),
            ));
        }
        let id = self.g.add_value(name, kind);
        self.names.insert(name.to_owned(), id);
        Ok(id)
    }

    fn tensor_value(&mut self, name: &str, field: &str) -> Result<ValueId> {
        let tm = self.src.tensor_values.get(name).ok_or_else(|| {
            CompileError::invalid(field, format!("no tensor_values entry for {name:?}"))
        })?;
        let meta = tensor_meta(tm, &format!("{field} ({name})"))?;
        self.new_value(name, ValueKind::Tensor(meta), field)
    }

    fn sym_value(&mut self, name: &str, field: &str) -> Result<ValueId> {
        let expr = match self.src.sym_int_values.get(name) {
            Some(json::SymInt::AsExpr(e)) => Expr::parse(&e.expr_str)?,
            Some(json::SymInt::AsInt(v)) => Expr::Const(*v),
            None => Expr::Sym(name.to_owned()),
        };
        self.new_value(name, ValueKind::SymInt(expr), field)
    }

    /// Defines the values of a graph input or node output; several for a tensor list.
    fn define(&mut self, out: &json::Argument, field: &str) -> Result<Vec<ValueId>> {
        Ok(match out {
            json::Argument::AsTensor(t) => vec![self.tensor_value(&t.name, field)?],
            json::Argument::AsTensors(ts) => ts
                .iter()
                .map(|t| self.tensor_value(&t.name, field))
                .collect::<Result<_>>()?,
            json::Argument::AsSymInt(json::SymIntArgument::AsName(n)) => {
                vec![self.sym_value(n, field)?]
            }
            json::Argument::AsSymFloat(json::SymFloatArgument::AsName(n)) => {
                vec![self.new_value(n, ValueKind::SymFloat, field)?]
            }
            json::Argument::AsSymBool(json::SymBoolArgument::AsName(n)) => {
                vec![self.new_value(n, ValueKind::SymBool, field)?]
            }
            json::Argument::AsNone(_) => {
                let name = format!("unused_{}", self.g.values.len());
                vec![self.g.add_value(&name, ValueKind::Unused)]
            }
            // A number specialised at export: a placeholder value; the signature says which.
            json::Argument::AsInt(_)
            | json::Argument::AsFloat(_)
            | json::Argument::AsBool(_)
            | json::Argument::AsString(_) => {
                let name = format!("literal_{}", self.g.values.len());
                vec![self.g.add_value(&name, ValueKind::Unused)]
            }
            other => {
                return Err(CompileError::unsupported(
                    field,
                    format!("output kind {other:?}"),
                ))
            }
        })
    }

    fn int_args(&self, items: &[json::SymIntArgument], field: &str) -> Result<Arg> {
        Ok(Arg::Ints(
            items
                .iter()
                .map(|i| match i {
                    json::SymIntArgument::AsInt(v) => Ok(IntArg::Const(*v)),
                    json::SymIntArgument::AsName(n) => Ok(IntArg::Sym(self.lookup(n, field)?)),
                })
                .collect::<Result<_>>()?,
        ))
    }

    /// Converts an argument, guided by the schema type when there is one.
    fn arg(&mut self, a: &json::Argument, ty: Option<&Ty>, field: &str) -> Result<Arg> {
        use json::Argument as J;
        let is_float = matches!(ty.map(Ty::inner), Some(Ty::Float));
        Ok(match a {
            J::AsNone(_) => Arg::None,
            J::AsTensor(t) => Arg::Tensor(self.lookup(&t.name, field)?),
            J::AsTensors(ts) => Arg::Tensors(
                ts.iter()
                    .map(|t| self.lookup(&t.name, field))
                    .collect::<Result<_>>()?,
            ),
            J::AsOptionalTensors(ts) => Arg::OptTensors(
                ts.iter()
                    .map(|t| match t {
                        json::OptionalTensorArgument::AsTensor(t) => {
                            self.lookup(&t.name, field).map(Some)
                        }
                        json::OptionalTensorArgument::AsNone(_) => Ok(None),
                    })
                    .collect::<Result<_>>()?,
            ),
            J::AsOptionalTensor(json::OptionalTensorArgument::AsTensor(t)) => {
                Arg::Tensor(self.lookup(&t.name, field)?)
            }
            J::AsOptionalTensor(json::OptionalTensorArgument::AsNone(_)) => Arg::None,
            J::AsInt(v) if is_float => Arg::Float(*v as f64),
            J::AsInt(v) => Arg::Int(*v),
            J::AsInts(vs) => {
                if matches!(ty.map(Ty::inner), Some(Ty::List(e, _)) if **e == Ty::Float) {
                    Arg::Floats(vs.iter().map(|v| *v as f64).collect())
                } else {
                    Arg::Ints(vs.iter().map(|v| IntArg::Const(*v)).collect())
                }
            }
            J::AsFloat(f) => Arg::Float(f.0),
            J::AsFloats(fs) => Arg::Floats(fs.iter().map(|f| f.0).collect()),
            J::AsString(s) => Arg::Str(s.clone()),
            J::AsBool(b) => Arg::Bool(*b),
            J::AsBools(bs) => Arg::Bools(bs.clone()),
            J::AsSymInt(json::SymIntArgument::AsInt(v)) => Arg::Int(*v),
            J::AsSymInt(json::SymIntArgument::AsName(n)) => Arg::SymInt(self.lookup(n, field)?),
            J::AsSymInts(items) => self.int_args(items, field)?,
            J::AsSymFloat(json::SymFloatArgument::AsFloat(f)) => Arg::Float(f.0),
            J::AsSymFloat(json::SymFloatArgument::AsName(n)) => {
                Arg::SymFloat(self.lookup(n, field)?)
            }
            J::AsSymBool(json::SymBoolArgument::AsBool(b)) => Arg::Bool(*b),
            J::AsSymBool(json::SymBoolArgument::AsName(n)) => Arg::SymBool(self.lookup(n, field)?),
            J::AsScalarType(code) => {
                Arg::ScalarType(dtype::from_export_code(*code).ok_or_else(|| {
                    CompileError::unsupported(field, format!("dtype code {code}"))
                })?)
            }
            // Export numbering: 1 contiguous, 2 channels last, 3 channels last 3d, 4 preserve.
            J::AsMemoryFormat(code) => Arg::MemoryFormat(match code {
                1 => 0,
                4 => 1,
                2 => 2,
                3 => 3,
                _ => {
                    return Err(CompileError::unsupported(
                        field,
                        format!("memory format {code}"),
                    ))
                }
            }),
            J::AsLayout(7) => Arg::Layout(0),
            J::AsLayout(l) => return Err(CompileError::unsupported(field, format!("layout {l}"))),
            J::AsDevice(d) if d.kind == "cpu" => Arg::Device,
            J::AsDevice(d) => {
                return Err(CompileError::unsupported(
                    field,
                    format!("device {:?}", d.kind),
                ))
            }
            other => {
                return Err(CompileError::unsupported(
                    field,
                    format!("argument {other:?}"),
                ))
            }
        })
    }

    fn node(&mut self, n: &'a json::Node, index: usize) -> Result<()> {
        let field = self.field(&format!("nodes[{index}] ({})", n.target));
        let op = op_of(&n.target)
            .ok_or_else(|| CompileError::unsupported(&field, format!("target {:?}", n.target)))?;
        let args = if op.is_cond() {
            self.cond_args(n, &field)?
        } else if op.name.starts_with("higher_order::") {
            return Err(CompileError::unsupported(
                &field,
                format!(
                    "{} (of the control-flow operators only torch.cond is compiled)",
                    n.target
                ),
            ));
        } else if op.name.starts_with("executorch_prim::") {
            // Positional, no schema to match.
            n.inputs
                .iter()
                .map(|a| self.arg(&a.arg, None, &field))
                .collect::<Result<Vec<_>>>()?
        } else {
            match schema::lookup(&op) {
                Some(s) => self.schema_args(n, s, &field)?,
                None => {
                    // Unknown to the table: keep the arguments as given; the decomposition
                    // check reports the operator with all others.
                    n.inputs
                        .iter()
                        .map(|a| self.arg(&a.arg, None, &field))
                        .collect::<Result<Vec<_>>>()?
                }
            }
        };
        let mut outputs = Vec::new();
        for (i, o) in n.outputs.iter().enumerate() {
            outputs.extend(self.define(o, &format!("{field}.outputs[{i}]"))?);
        }
        self.nodes.push(Node { op, args, outputs });
        Ok(())
    }

    /// `cond(pred, true_graph, false_graph, operands)`: the branches become blocks over the
    /// operands.
    fn cond_args(&mut self, n: &'a json::Node, field: &str) -> Result<Vec<Arg>> {
        let [pred, t, f, ops] = n.inputs.as_slice() else {
            return Err(CompileError::invalid(field, "cond takes four arguments"));
        };
        let pred = self.arg(&pred.arg, None, field)?;
        let operands = match self.arg(&ops.arg, None, field)? {
            Arg::Tensors(v) => v,
            Arg::Tensor(v) => vec![v],
            other => {
                return Err(CompileError::unsupported(
                    field,
                    format!("cond operands {other:?}"),
                ))
            }
        };
        let (json::Argument::AsGraph(tg), json::Argument::AsGraph(fg)) = (&t.arg, &f.arg) else {
            return Err(CompileError::invalid(field, "cond branches are not graphs"));
        };
        let tb = self.block(tg, &operands, field)?;
        let fb = self.block(fg, &operands, field)?;
        Ok(vec![
            pred,
            Arg::Block(Box::new(tb)),
            Arg::Block(Box::new(fb)),
            Arg::Tensors(operands),
        ])
    }

    fn schema_args(&mut self, n: &json::Node, s: &schema::Schema, field: &str) -> Result<Vec<Arg>> {
        let mut given: BTreeMap<&str, &json::Argument> = BTreeMap::new();
        for a in &n.inputs {
            if given.insert(a.name.as_str(), &a.arg).is_some() {
                return Err(CompileError::invalid(
                    field,
                    format!("argument {:?} given twice", a.name),
                ));
            }
        }
        let mut args = Vec::with_capacity(s.args.len());
        for sa in &s.args {
            let arg = match given.remove(sa.name.as_str()) {
                Some(a) => self.arg(a, Some(&sa.ty), &format!("{field}.{}", sa.name))?,
                None => sa.default.clone().ok_or_else(|| {
                    CompileError::invalid(field, format!("missing argument {:?}", sa.name))
                })?,
            };
            args.push(arg);
        }
        if let Some((name, _)) = given.into_iter().next() {
            return Err(CompileError::invalid(
                field,
                format!("unknown argument {name:?}"),
            ));
        }
        Ok(args)
    }
}
