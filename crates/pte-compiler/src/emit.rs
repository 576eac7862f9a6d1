//! Emission: planned graphs to an ExecuTorch program (`et::Program`), as upstream's
//! emitter (`exir/emit/_emitter.py`) lays it out.
//!
//! - Values: method inputs first (constants, mutable buffers, user inputs in graph order),
//!   then each instruction's arguments and results as they are met; every int of an int
//!   list is its own `Int` value (the list holds indices), symbolic sizes are the `Int`
//!   values their `sym_size` / prim instructions write.
//! - Kernel calls list every schema argument (defaults included, `None` as `Null`), then
//!   the results: the out tensor again, or one `TensorList` for several.
//! - Constants are deduplicated by content across methods into the constant segment (or
//!   named by their fully qualified name into a `.ptd`); mutated buffers are planned and
//!   carry their initial values in the mutable data segment; dynamic tensors are
//!   `DYNAMIC_BOUND` with their upper-bound sizes.
//! - `torch.cond` becomes `JumpFalse` over the true branch, `Move`s of the branch results,
//!   an unconditional `JumpFalse` over the false branch, and the false branch.
//! - Static `view_copy`s cost nothing: their result aliases the input's memory.

use std::borrow::Cow;
use std::collections::HashMap;

use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{DataEntry, ProgramImage, Segment, TensorLayout, WriteOptions};

use crate::error::{CompileError, Result};
use crate::import::{InputKind, OutputKind, Program};
use crate::ir::{Arg, IntArg, Node, ValueId, ValueKind};
use crate::passes::plan::MemoryPlan;
use crate::schema::{self, Ty};

/// How constants are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConstantPlacement {
    /// In the program's constant segment.
    Program,
    /// In a `.ptd` file, keyed by fully qualified name.
    External,
}

/// Constants shared by all methods.
#[derive(Default)]
struct Pool {
    /// Constant segment buffers; index 0 is the reserved placeholder.
    buffers: Vec<Vec<u8>>,
    /// Buffers by a cheap fingerprint of their bytes; equal fingerprints are compared.
    index: HashMap<u64, Vec<u32>>,
    /// Initial values of mutable buffers; index 0 is the placeholder.
    mutable: Vec<Vec<u8>>,
    /// `.ptd` entries (key -> layout, data).
    external: Vec<DataEntry<'static>>,
}

impl Pool {
    fn new() -> Self {
        Pool {
            buffers: vec![Vec::new()],
            mutable: vec![Vec::new()],
            ..Default::default()
        }
    }

    /// Hashes the length and up to 4 KiB sampled across the bytes: weights differ early,
    /// and candidates with equal fingerprints are compared in full.
    fn fingerprint(bytes: &[u8]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.len().hash(&mut h);
        let step = (bytes.len() / 4096).max(1);
        bytes
            .iter()
            .step_by(step)
            .take(4096)
            .for_each(|b| b.hash(&mut h));
        h.finish()
    }

    fn constant(&mut self, bytes: Vec<u8>) -> u32 {
        let key = Self::fingerprint(&bytes);
        let same = self.index.get(&key).and_then(|c| {
            c.iter()
                .copied()
                .find(|&i| self.buffers.get(i as usize).is_some_and(|b| *b == bytes))
        });
        if let Some(i) = same {
            return i;
        }
        let i = self.buffers.len() as u32;
        self.buffers.push(bytes);
        self.index.entry(key).or_default().push(i);
        i
    }

    /// Adds an external entry, returning the key it is stored under.
    fn external(&mut self, key: &str, layout: TensorLayout, bytes: Vec<u8>) -> String {
        let mut k = key.to_owned();
        let mut n = 0;
        loop {
            match self.external.iter().find(|e| e.key == k) {
                None => break,
                Some(e) if e.layout.as_ref() == Some(&layout) && *e.data == *bytes.as_slice() => {
                    return k
                }
                Some(_) => {
                    n += 1;
                    k = format!("{key}_{n}");
                }
            }
        }
        self.external.push(DataEntry {
            key: k.clone(),
            layout: Some(layout),
            data: Cow::Owned(bytes),
            alignment: 16,
        });
        k
    }
}

struct Method<'a> {
    p: &'a Program,
    /// The program's constant data, taken as each constant is emitted.
    constants: HashMap<ValueId, crate::archive::TensorData>,
    plan: &'a MemoryPlan,
    placement: ConstantPlacement,
    pool: &'a mut Pool,
    values: Vec<et::EValue>,
    ids: HashMap<ValueId, i32>,
    instructions: Vec<et::Instruction>,
    operators: Vec<et::Operator>,
    op_index: HashMap<(String, String), i32>,
}

fn ev(val: et::KernelTypes) -> et::EValue {
    et::EValue { val: Some(val) }
}

fn overflow(what: &str) -> CompileError {
    CompileError::Overflow(what.to_owned())
}

impl Method<'_> {
    fn push(&mut self, v: et::EValue) -> Result<i32> {
        let id = i32::try_from(self.values.len()).map_err(|_| overflow("value count"))?;
        self.values.push(v);
        Ok(id)
    }

    fn int(&mut self, v: i64) -> Result<i32> {
        self.push(ev(et::KernelTypes::Int(Box::new(et::Int { int_val: v }))))
    }

    fn fqn(&self, v: ValueId) -> Option<String> {
        let pos = self.p.graph.inputs.iter().position(|&i| i == v)?;
        match self.p.input_kinds.get(pos)? {
            InputKind::Parameter(f) | InputKind::Buffer(f) | InputKind::Constant(f) => {
                Some(f.clone())
            }
            InputKind::User | InputKind::Literal(_) => None,
        }
    }

    fn tensor(&mut self, v: ValueId) -> Result<i32> {
        if let Some(&id) = self.ids.get(&v) {
            return Ok(id);
        }
        let name = self.p.graph.name(v).to_owned();
        let meta = self
            .p
            .graph
            .meta(v)
            .cloned()
            .ok_or_else(|| CompileError::invalid(&name, "expected a tensor value"))?;
        let mut sizes = Vec::with_capacity(meta.rank());
        for d in &meta.sizes {
            let n = match d.as_const() {
                Some(c) => Some(c),
                None => d.to_expr().upper_bound(&self.p.ranges),
            }
            .ok_or_else(|| {
                CompileError::unsupported(&name, "a dynamic size without an upper bound")
            })?;
            sizes.push(i32::try_from(n).map_err(|_| overflow("tensor size"))?);
        }
        let layout = TensorLayout {
            scalar_type: meta.dtype,
            sizes: sizes.clone(),
            dim_order: meta.dim_order.clone(),
        };
        let mut data_buffer_idx = 0;
        let mut extra = None;
        let allocation_info = self.plan.offsets.get(&v).map(|&off| {
            Box::new(et::AllocationDetails {
                memory_id: 1,
                memory_offset_low: (off & 0xffff_ffff) as u32,
                memory_offset_high: (off >> 32) as u32,
            })
        });
        if let Some(data) = self.constants.remove(&v) {
            if allocation_info.is_some() {
                // A mutable buffer: its initial value.
                data_buffer_idx = self.pool.mutable.len() as u32;
                self.pool.mutable.push(data.bytes);
            } else if self.placement == ConstantPlacement::External {
                let key = self.fqn(v).unwrap_or_else(|| name.clone());
                let key = self.pool.external(&key, layout, data.bytes);
                extra = Some(Box::new(et::ExtraTensorInfo {
                    fully_qualified_name: Some(key),
                    location: et::TensorDataLocation::External,
                    ..Default::default()
                }));
            } else {
                data_buffer_idx = self.pool.constant(data.bytes);
            }
        }
        let t = et::Tensor {
            scalar_type: meta.dtype,
            storage_offset: 0,
            sizes: Some(sizes),
            dim_order: Some(meta.dim_order.clone()),
            requires_grad: false,
            data_buffer_idx,
            allocation_info,
            layout: 0,
            shape_dynamism: if meta.is_dynamic() {
                et::TensorShapeDynamism::DynamicBound
            } else {
                et::TensorShapeDynamism::Static
            },
            extra_tensor_info: extra,
        };
        let id = self.push(ev(et::KernelTypes::Tensor(Box::new(t))))?;
        self.ids.insert(v, id);
        Ok(id)
    }

    fn sym(&self, v: ValueId) -> Result<i32> {
        self.ids.get(&v).copied().ok_or_else(|| {
            CompileError::invalid(
                self.p.graph.name(v).to_owned(),
                "symbolic value used before it is computed",
            )
        })
    }

    /// The value index of an argument of schema type `ty`.
    fn arg(&mut self, a: &Arg, ty: Option<&Ty>) -> Result<i32> {
        let inner = ty.map(Ty::inner);
        let val = match a {
            Arg::None if matches!(ty, Some(Ty::Tensor)) => {
                et::KernelTypes::Tensor(Box::new(et::Tensor {
                    scalar_type: et::ScalarType::Byte,
                    sizes: Some(vec![0]),
                    dim_order: Some(vec![0]),
                    ..Default::default()
                }))
            }
            Arg::None => et::KernelTypes::Null(Box::new(et::Null {})),
            Arg::Tensor(v) => return self.tensor(*v),
            Arg::SymInt(v) | Arg::SymFloat(v) | Arg::SymBool(v) => return self.sym(*v),
            // `Tensor?[]` given as a plain tensor list (e.g. `index.Tensor`'s indices).
            Arg::Tensors(vs) if matches!(inner, Some(Ty::List(e, _)) if matches!(**e, Ty::Optional(_))) =>
            {
                let items = vs.iter().map(|&v| self.tensor(v)).collect::<Result<_>>()?;
                et::KernelTypes::OptionalTensorList(Box::new(et::OptionalTensorList {
                    items: Some(items),
                }))
            }
            Arg::Tensors(vs) => {
                let items = vs.iter().map(|&v| self.tensor(v)).collect::<Result<_>>()?;
                et::KernelTypes::TensorList(Box::new(et::TensorList { items: Some(items) }))
            }
            Arg::OptTensors(vs) => {
                let items = vs
                    .iter()
                    .map(|v| v.map_or(Ok(-1), |v| self.tensor(v)))
                    .collect::<Result<_>>()?;
                et::KernelTypes::OptionalTensorList(Box::new(et::OptionalTensorList {
                    items: Some(items),
                }))
            }
            Arg::Int(i) if matches!(inner, Some(Ty::Float)) => {
                et::KernelTypes::Double(Box::new(et::Double {
                    double_val: *i as f64,
                }))
            }
            Arg::Int(i) if matches!(inner, Some(Ty::Bool)) => {
                et::KernelTypes::Bool(Box::new(et::Bool { bool_val: *i != 0 }))
            }
            Arg::Int(i) => et::KernelTypes::Int(Box::new(et::Int { int_val: *i })),
            Arg::Ints(items) => {
                let mut idx = Vec::with_capacity(items.len());
                for i in items {
                    idx.push(i64::from(match i {
                        IntArg::Const(c) => self.int(*c)?,
                        IntArg::Sym(v) => self.sym(*v)?,
                    }));
                }
                et::KernelTypes::IntList(Box::new(et::IntList { items: Some(idx) }))
            }
            Arg::Float(f) => et::KernelTypes::Double(Box::new(et::Double { double_val: *f })),
            Arg::Floats(f) => et::KernelTypes::DoubleList(Box::new(et::DoubleList {
                items: Some(f.clone()),
            })),
            Arg::Bool(b) => et::KernelTypes::Bool(Box::new(et::Bool { bool_val: *b })),
            Arg::Bools(b) => et::KernelTypes::BoolList(Box::new(et::BoolList {
                items: Some(b.clone()),
            })),
            Arg::Str(s) => et::KernelTypes::String(Box::new(et::String {
                string_val: Some(s.clone()),
            })),
            Arg::ScalarType(d) => et::KernelTypes::Int(Box::new(et::Int { int_val: *d as i64 })),
            Arg::MemoryFormat(m) | Arg::Layout(m) => {
                et::KernelTypes::Int(Box::new(et::Int { int_val: *m }))
            }
            Arg::Device => et::KernelTypes::Null(Box::new(et::Null {})),
            Arg::Block(_) => return Err(CompileError::invalid("emit", "a block as an argument")),
        };
        self.push(ev(val))
    }

    fn operator(&mut self, name: &str, overload: &str) -> Result<i32> {
        let key = (name.to_owned(), overload.to_owned());
        if let Some(&i) = self.op_index.get(&key) {
            return Ok(i);
        }
        let i = i32::try_from(self.operators.len()).map_err(|_| overflow("operator count"))?;
        self.operators.push(et::Operator {
            name: Some(name.to_owned()),
            overload: Some(overload.to_owned()),
        });
        self.op_index.insert(key, i);
        Ok(i)
    }

    fn kernel(&mut self, name: &str, overload: &str, args: Vec<i32>) -> Result<()> {
        let op_index = self.operator(name, overload)?;
        self.instructions.push(et::Instruction {
            instr_args: Some(et::InstructionArguments::KernelCall(Box::new(
                et::KernelCall {
                    op_index,
                    args: Some(args),
                },
            ))),
        });
        Ok(())
    }

    fn index(&self) -> Result<i32> {
        i32::try_from(self.instructions.len()).map_err(|_| overflow("instruction count"))
    }

    fn nodes(&mut self, nodes: &[Node]) -> Result<()> {
        for n in nodes {
            self.node(n)?;
        }
        Ok(())
    }

    fn node(&mut self, n: &Node) -> Result<()> {
        let key = n.op.key();
        if n.op.is_cond() {
            return self.cond(n);
        }
        if key == "aten::sym_size.int"
            || n.op.name.starts_with("executorch_prim::")
            || key == "aten::sym_numel"
        {
            let mut args = Vec::new();
            for a in &n.args {
                args.push(self.arg(a, None)?);
            }
            let out = n.outputs.first().copied().unwrap_or_default();
            let ret = match self.p.graph.value(out).map(|v| &v.kind) {
                Some(ValueKind::SymBool) => {
                    et::KernelTypes::Bool(Box::new(et::Bool { bool_val: false }))
                }
                Some(ValueKind::SymFloat) => {
                    et::KernelTypes::Double(Box::new(et::Double { double_val: 0.0 }))
                }
                _ => et::KernelTypes::Int(Box::new(et::Int { int_val: 0 })),
            };
            let r = self.push(ev(ret))?;
            self.ids.insert(out, r);
            args.push(r);
            return self.kernel(&n.op.name, &n.op.overload, args);
        }
        let s = schema::lookup(&n.op).ok_or_else(|| CompileError::NoDecomposition {
            ops: vec![key.clone()],
        })?;
        if key == "aten::view_copy.out" {
            let out = n.outputs.first().copied().unwrap_or_default();
            if self.p.graph.meta(out).is_some_and(|m| m.is_dynamic()) {
                let a0 = self.arg(n.args.first().unwrap_or(&Arg::None), Some(&Ty::Tensor))?;
                let a1 = self.arg(n.args.get(1).unwrap_or(&Arg::None), None)?;
                let o = self.tensor(out)?;
                return self.kernel("executorch_prim::et_view", "default", vec![a0, a1, o]);
            }
            if self.plan.aliases.contains_key(&out) {
                self.tensor(out)?;
                return Ok(());
            }
        }
        let mut args = Vec::with_capacity(n.args.len() + 1);
        for (a, sa) in n.args.iter().zip(&s.args) {
            args.push(self.arg(a, Some(&sa.ty))?);
        }
        // The results: the out arguments again.
        let outs: Vec<&Arg> = n.args.iter().skip(s.num_inputs()).collect();
        match outs.as_slice() {
            [] => {}
            [Arg::Tensor(v)] => args.push(self.tensor(*v)?),
            [Arg::Tensors(vs)] => {
                let items = vs.iter().map(|&v| self.tensor(v)).collect::<Result<_>>()?;
                args.push(self.push(ev(et::KernelTypes::TensorList(Box::new(
                    et::TensorList { items: Some(items) },
                ))))?);
            }
            many => {
                let mut items = Vec::new();
                for a in many {
                    if let Arg::Tensor(v) = a {
                        items.push(self.tensor(*v)?);
                    }
                }
                args.push(self.push(ev(et::KernelTypes::TensorList(Box::new(
                    et::TensorList { items: Some(items) },
                ))))?);
            }
        }
        self.kernel(&s.op.name, &s.op.overload, args)
    }

    fn jump(&mut self, cond: i32) -> Result<usize> {
        self.instructions.push(et::Instruction {
            instr_args: Some(et::InstructionArguments::JumpFalseCall(Box::new(
                et::JumpFalseCall {
                    cond_value_index: cond,
                    destination_instruction: 0,
                },
            ))),
        });
        Ok(self.instructions.len() - 1)
    }

    fn land(&mut self, at: usize) -> Result<()> {
        let dest = self.index()?;
        if let Some(et::Instruction {
            instr_args: Some(et::InstructionArguments::JumpFalseCall(j)),
        }) = self.instructions.get_mut(at)
        {
            j.destination_instruction = dest;
        }
        Ok(())
    }

    fn moves(&mut self, outputs: &[Arg], targets: &[ValueId]) -> Result<()> {
        for (o, &t) in outputs.iter().zip(targets) {
            let from = self.arg(o, Some(&Ty::Tensor))?;
            let to = self.tensor(t)?;
            if from != to {
                self.instructions.push(et::Instruction {
                    instr_args: Some(et::InstructionArguments::MoveCall(Box::new(et::MoveCall {
                        move_from: from,
                        move_to: to,
                    }))),
                });
            }
        }
        Ok(())
    }

    fn cond(&mut self, n: &Node) -> Result<()> {
        let (Some(pred), Some(Arg::Block(t)), Some(Arg::Block(f))) =
            (n.args.first(), n.args.get(1), n.args.get(2))
        else {
            return Err(CompileError::invalid(
                "cond",
                "expected (pred, true branch, false branch)",
            ));
        };
        let pred = self.arg(pred, None)?;
        for &o in &n.outputs {
            self.tensor(o)?;
        }
        let skip_true = self.jump(pred)?;
        self.nodes(&t.nodes)?;
        self.moves(&t.outputs, &n.outputs)?;
        let never = self.push(ev(et::KernelTypes::Bool(Box::new(et::Bool {
            bool_val: false,
        }))))?;
        let skip_false = self.jump(never)?;
        self.land(skip_true)?;
        self.nodes(&f.nodes)?;
        self.moves(&f.outputs, &n.outputs)?;
        self.land(skip_false)
    }
}

/// One method's execution plan.
fn method(
    p: &mut Program,
    plan: &MemoryPlan,
    placement: ConstantPlacement,
    pool: &mut Pool,
) -> Result<et::ExecutionPlan> {
    let constants = std::mem::take(&mut p.constants);
    let p = &*p;
    let mut m = Method {
        p,
        constants,
        plan,
        placement,
        pool,
        values: Vec::new(),
        ids: HashMap::new(),
        instructions: Vec::new(),
        operators: Vec::new(),
        op_index: HashMap::new(),
    };
    let uses = p.graph.use_counts();
    let mut inputs = Vec::new();
    for (&v, k) in p.graph.inputs.iter().zip(&p.input_kinds) {
        let used = uses.get(v).copied().unwrap_or(0) > 0;
        match k {
            InputKind::User => {
                let id = match p.graph.value(v).map(|x| &x.kind) {
                    Some(ValueKind::Tensor(_)) => m.tensor(v)?,
                    _ => {
                        return Err(CompileError::unsupported(
                            p.graph.name(v).to_owned(),
                            "non-tensor method inputs",
                        ))
                    }
                };
                inputs.push(id);
            }
            InputKind::Literal(a) => {
                // Upstream's runtime checks that the caller passes this very value.
                let id = m.arg(a, None)?;
                inputs.push(id);
            }
            _ if used || m.plan.offsets.contains_key(&v) => {
                m.tensor(v)?;
            }
            _ => {}
        }
    }
    m.nodes(&p.graph.nodes)?;
    // Write mutated buffers back at the end.
    for (o, k) in p.graph.outputs.iter().zip(&p.output_kinds) {
        let target = match k {
            OutputKind::User => continue,
            OutputKind::BufferMutation(f) => p
                .graph
                .inputs
                .iter()
                .zip(&p.input_kinds)
                .find(|(_, ik)| matches!(ik, InputKind::Buffer(b) if b == f))
                .map(|(&v, _)| v),
            OutputKind::UserInputMutation(name) => p
                .graph
                .inputs
                .iter()
                .copied()
                .find(|&v| p.graph.name(v) == name),
        };
        let (Some(target), Some(src)) = (target, o.tensor()) else {
            return Err(CompileError::invalid(
                "graph outputs",
                "a mutation output without its input",
            ));
        };
        if target != src {
            let t = m.tensor(target)?;
            let s = m.tensor(src)?;
            let nb = m.push(ev(et::KernelTypes::Bool(Box::new(et::Bool {
                bool_val: false,
            }))))?;
            m.kernel("aten::copy_", "", vec![t, s, nb, t])?;
        }
    }
    let mut outputs = Vec::new();
    for (o, k) in p.graph.outputs.iter().zip(&p.output_kinds) {
        if *k == OutputKind::User {
            let ty = match o {
                Arg::Tensor(_) => Some(Ty::Tensor),
                _ => None,
            };
            outputs.push(m.arg(o, ty.as_ref())?);
        }
    }
    let chain = et::Chain {
        inputs: Some(Vec::new()),
        outputs: Some(Vec::new()),
        instructions: Some(std::mem::take(&mut m.instructions)),
        stacktrace: None,
    };
    Ok(et::ExecutionPlan {
        name: Some(p.name.clone()),
        container_meta_type: Some(Box::new(et::ContainerMetadata {
            encoded_inp_str: Some(p.in_spec.clone()),
            encoded_out_str: Some(p.out_spec.clone()),
        })),
        values: Some(m.values),
        inputs: Some(inputs),
        outputs: Some(outputs),
        chains: Some(vec![chain]),
        operators: Some(m.operators),
        delegates: Some(Vec::new()),
        non_const_buffer_sizes: Some(vec![
            0,
            i64::try_from(plan.total).map_err(|_| overflow("planned memory"))?,
        ]),
        non_const_buffer_device: None,
    })
}

/// The bytes of a `.pte` (and `.ptd` when constants are external).
pub struct Output {
    /// The program.
    pub pte: Vec<u8>,
    /// External constants, for [`ConstantPlacement::External`] (none when the program has
    /// no constants).
    pub ptd: Option<Vec<u8>>,
}

/// Emits and serializes the methods.
pub fn emit(
    mut methods: Vec<(Program, MemoryPlan)>,
    placement: ConstantPlacement,
    options: &WriteOptions,
) -> Result<Output> {
    let mut pool = Pool::new();
    let mut plans = Vec::new();
    for (p, plan) in &mut methods {
        plans.push(method(p, plan, placement, &mut pool)?);
    }
    let program = et::Program {
        version: 0,
        execution_plan: Some(plans),
        constant_buffer: Some(
            std::mem::take(&mut pool.buffers)
                .into_iter()
                .map(|b| et::Buffer { storage: Some(b) })
                .collect(),
        ),
        backend_delegate_data: Some(Vec::new()),
        segments: Some(Vec::new()),
        constant_segment: None,
        mutable_data_segments: None,
        named_data: None,
    };
    let mut image = ProgramImage {
        program,
        segments: Vec::new(),
    };
    image.move_inline_data_to_segments(options)?;
    if pool.mutable.len() > 1 {
        let mut data = Vec::new();
        let mut offsets = Vec::new();
        for b in &pool.mutable {
            data.resize(data.len().next_multiple_of(16), 0);
            offsets.push(data.len() as u64);
            data.extend_from_slice(b);
        }
        let segment_index = image.push_segment(Segment::new(data));
        image.program.mutable_data_segments = Some(vec![et::SubsegmentOffsets {
            segment_index,
            offsets: Some(offsets),
        }]);
    }
    let pte = image.write(options)?;
    // Upstream's loader refuses an empty data file, so none is written without constants.
    let ptd = match placement {
        ConstantPlacement::External if !pool.external.is_empty() => {
            Some(pte_format::write_ptd(&pool.external, options)?)
        }
        _ => None,
    };
    Ok(Output { pte, ptd })
}
