//! Running a prepared graph: shapes, the memory plan, and each node's views of its data.
//!
//! Every value lives in one place: a graph input or output in the delegate call's own
//! tensor (when its bytes are laid out as ours), a constant materialized at load, or a
//! range of one arena. The arena is planned from the values' lifetimes (first-fit over
//! a list of free ranges, values placed in the order nodes produce them), so values
//! that are never alive at the same time share memory, as XNNPACK's planner does. The
//! arena and the nodes' scratch memory belong to the method's [`Workspace`], shared by
//! all its delegate calls (they run one at a time), so a program split into many
//! delegates holds, and first touches, the memory of its largest call only.
//! Shapes are inferred node by node from the input shapes, once at load and again
//! whenever a call's input shapes change; the arena then grows if it must.
//!
//! Float values (fp32, fp16, bf16) are held as f32: nodes compute in f32, and the output
//! of a node whose value is fp16 or bf16 is rounded to that type, which is what
//! XNNPACK's f16 kernels on x86 (convert, compute in f32, convert back) produce.

use std::sync::Arc;

use half::{bf16, f16};
use pte_compute::ThreadPool;
use pte_runtime::{
    Arg, Args, Buffer, DType, DerivedStates, KernelError, KernelResult, MemoryBudget, PartProfile,
    StepTimes, Workspace, INLINE_READS, INLINE_WRITES, MANY_READS, MANY_WRITES,
};
use smallvec::SmallVec;

use crate::error::{Result, XnnError};
use crate::graph::{checked_numel, Datatype, Dims, Graph, Quant};
use crate::ops::{self, Prepared};

/// Alignment of arena ranges (a cache line).
const ALIGN: usize = 64;

/// How a value's elements are held while the graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Storage {
    F32,
    I8,
    U8,
    I32,
    /// Constants only (4-bit weights), read by the kernel that captured them.
    Packed,
}

impl Storage {
    pub(crate) fn of(d: Datatype) -> Storage {
        match d {
            Datatype::F32 | Datatype::F16 | Datatype::Bf16 => Storage::F32,
            Datatype::QInt8 | Datatype::QcInt8 | Datatype::QdInt8 => Storage::I8,
            Datatype::QUInt8 => Storage::U8,
            Datatype::QInt32 | Datatype::QcInt32 | Datatype::Int32 => Storage::I32,
            Datatype::QcInt4 | Datatype::QbInt4 => Storage::Packed,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Storage::F32 | Storage::I32 => 4,
            Storage::I8 | Storage::U8 | Storage::Packed => 1,
        }
    }
}

/// Bytes a value of `dims` takes while the graph runs: its elements, and for
/// dynamically quantized values their per-row scale and zero point after them.
pub(crate) fn value_bytes(dtype: Datatype, quant: &Quant, dims: &[usize]) -> Option<usize> {
    let numel = checked_numel(dims)?;
    let data = numel.checked_mul(Storage::of(dtype).bytes())?;
    match quant {
        Quant::PerToken { nonbatch_dims } => {
            let rows = checked_numel(dims.get(..dims.len().saturating_sub(*nonbatch_dims))?)?;
            data.div_ceil(8)
                .checked_mul(8)?
                .checked_add(rows.checked_mul(8)?)
        }
        _ => Some(data),
    }
}

/// Where a value's bytes are while the graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Not materialized (a constant a kernel captured, or a value nothing reads).
    None,
    /// The call's argument `arg`, read directly.
    Input(usize),
    /// The call's argument `arg`, written directly.
    Output(usize),
    /// Constant `k` of `Exec::constants`.
    Constant(usize),
    /// `len` bytes at `offset` in the arena.
    Arena { offset: usize, len: usize },
}

/// A graph input or output and how it crosses the boundary.
#[derive(Clone, Copy, Debug)]
struct External {
    value: usize,
    arg: usize,
    /// The call's dtype for it.
    dtype: DType,
    /// True when the bytes are ours as they are (else converted through the arena).
    direct: bool,
}

/// A view of one input of a node.
pub(crate) struct In<'a> {
    pub bytes: &'a [u8],
    pub dims: &'a [usize],
}

/// A view of one output of a node.
pub(crate) struct Out<'a> {
    pub bytes: &'a mut [u8],
    pub dims: &'a [usize],
}

/// What a kernel gets besides its data.
pub(crate) struct Cx<'a> {
    pub pool: &'a ThreadPool,
    pub scratch: &'a mut Buffer,
}

/// One node, prepared.
struct Step {
    prepared: Prepared,
    inputs: SmallVec<[Option<usize>; 5]>,
    outputs: SmallVec<[usize; 2]>,
    /// Outputs to round to fp16 / bf16 after the kernel runs.
    round: SmallVec<[(usize, Datatype); 2]>,
    index: usize,
    kind: &'static str,
    debug_handle: u32,
}

/// A prepared graph, ready to run.
pub(crate) struct Exec {
    dtypes: Vec<Datatype>,
    quants: Vec<Quant>,
    shapes: Vec<Dims>,
    places: Vec<Place>,
    constants: Vec<Buffer>,
    steps: Vec<Step>,
    inputs: Vec<External>,
    outputs: Vec<External>,
    /// The arena and scratch memory, shared with the method's other delegate calls.
    workspace: Workspace,
    pool: Arc<ThreadPool>,
    /// Input shapes (physical) the current plan was made for.
    planned_for: Vec<Dims>,
    /// Steps the current plan skips: copies whose output shares its input's memory.
    elided: Vec<bool>,
    /// Runs and time per step, when profiling is on.
    profile: StepTimes,
}

fn storage_err(what: &str, e: pte_runtime::MemoryError) -> XnnError {
    XnnError::memory(what.to_owned(), e)
}

impl Exec {
    /// Prepares every node and plans memory for the payload's shapes. `call` gives the
    /// delegate call's argument dtypes by external id.
    pub(crate) fn new(
        graph: &Graph,
        call: &[Option<DType>],
        budget: &MemoryBudget,
        pool: Arc<ThreadPool>,
        workspace: Workspace,
        derived: &DerivedStates,
    ) -> Result<Exec> {
        let n = graph.values.len();
        let mut places = vec![Place::None; n];
        let mut used = vec![false; n];
        for node in &graph.nodes {
            for &i in node.inputs.iter().flatten() {
                if let Some(u) = used.get_mut(i) {
                    *u = true;
                }
            }
        }
        // Externals.
        let external = |value: usize, input: bool| -> Result<External> {
            let v = graph
                .values
                .get(value)
                .ok_or_else(|| XnnError::graph("bad external"))?;
            let arg = v.external.unwrap_or(0) as usize;
            let dtype = call.get(arg).copied().flatten().ok_or_else(|| {
                XnnError::Arguments(format!(
                    "external id {arg} (value {}) has no tensor argument",
                    v.id
                ))
            })?;
            // Direct when the call's bytes are laid out as ours (fp16 and bf16 values are
            // held as f32, so they cross converted; so do int32 indices given as int64).
            let ok = match (v.dtype, dtype) {
                (Datatype::F32, DType::F32)
                | (Datatype::QInt8, DType::I8)
                | (Datatype::QUInt8, DType::U8)
                | (Datatype::Int32, DType::I32) => Some(true),
                (Datatype::F16, DType::F16) | (Datatype::Bf16, DType::BF16) => Some(false),
                (Datatype::Int32, DType::I64) if !input => Some(false),
                _ => None,
            };
            let direct = ok.ok_or_else(|| {
                XnnError::Arguments(format!(
                    "value {} ({}) is bound to argument {arg} of dtype {dtype}",
                    v.id,
                    v.dtype.name()
                ))
            })?;
            Ok(External {
                value,
                arg,
                dtype,
                direct,
            })
        };
        let inputs = graph
            .inputs
            .iter()
            .map(|&v| external(v, true))
            .collect::<Result<Vec<_>>>()?;
        let outputs = graph
            .outputs
            .iter()
            .map(|&v| external(v, false))
            .collect::<Result<Vec<_>>>()?;
        for e in &inputs {
            if let Some(u) = used.get_mut(e.value) {
                *u = true;
            }
        }
        for e in &outputs {
            if let Some(u) = used.get_mut(e.value) {
                *u = true;
            }
        }

        // Nodes.
        let mut steps = Vec::with_capacity(graph.nodes.len());
        let mut captured_constant = vec![true; n];
        let mut read_in_place = vec![false; n];
        for (index, node) in graph.nodes.iter().enumerate() {
            let fail = |message: String| XnnError::Node {
                index,
                kind: node.kind,
                debug_handle: node.debug_handle,
                message,
            };
            let prepared =
                ops::prepare(node, graph, budget, &pool, derived).map_err(|e| match e {
                    ops::PrepareError::Invalid(m) => fail(m),
                    ops::PrepareError::Memory(source) => XnnError::Memory {
                        what: format!(
                            "node {index} ({}, debug handle {}): prepared weights",
                            node.kind, node.debug_handle
                        ),
                        source,
                    },
                })?;
            for (pos, &input) in node.inputs.iter().enumerate() {
                if let Some(i) = input {
                    if !prepared.captures(pos) {
                        if let Some(c) = captured_constant.get_mut(i) {
                            *c = false;
                        }
                    }
                    if prepared.reads_in_place(pos) {
                        if let Some(r) = read_in_place.get_mut(i) {
                            *r = true;
                        }
                    }
                }
            }
            let round = node
                .outputs
                .iter()
                .filter_map(|&o| {
                    let d = graph.values.get(o)?.dtype;
                    matches!(d, Datatype::F16 | Datatype::Bf16).then_some((o, d))
                })
                .collect();
            steps.push(Step {
                prepared,
                inputs: node.inputs.clone(),
                outputs: node.outputs.clone(),
                round,
                index,
                kind: node.kind,
                debug_handle: node.debug_handle,
            });
        }

        // Constants that some kernel reads at run time are materialized in our storage.
        let mut constants = Vec::new();
        for (i, v) in graph.values.iter().enumerate() {
            let Some(data) = &v.data else { continue };
            if captured_constant.get(i) == Some(&true) || used.get(i) != Some(&true) {
                continue;
            }
            let buf =
                materialize(v.dtype, data.bytes(), budget).map_err(|e| XnnError::value(v.id, e))?;
            if let Some(p) = places.get_mut(i) {
                *p = Place::Constant(constants.len());
            }
            constants.push(buf);
        }
        let mut exec = Exec {
            dtypes: graph.values.iter().map(|v| v.dtype).collect(),
            quants: graph.values.iter().map(|v| v.quant.clone()).collect(),
            shapes: graph.values.iter().map(|v| v.dims.clone()).collect(),
            places,
            constants,
            steps,
            inputs,
            outputs,
            workspace,
            pool,
            planned_for: Vec::new(),
            elided: Vec::new(),
            profile: StepTimes::default(),
        };
        let shapes: Vec<Dims> = exec
            .inputs
            .iter()
            .map(|e| {
                graph
                    .values
                    .get(e.value)
                    .map(|v| v.dims.clone())
                    .unwrap_or_default()
            })
            .collect();
        exec.plan(&shapes)?;
        // Every kernel now holds its copy of the constants it captured (those that pack
        // for the shapes they see did so while the shapes were planned), as do the
        // materialized ones: the file's copies leave the resident set, but for those
        // read in place. A kernel preparing anew for other shapes maps them again.
        for (v, in_place) in graph.values.iter().zip(read_in_place) {
            if let (Some(data), false) = (&v.data, in_place) {
                data.release_pages();
            }
        }
        Ok(exec)
    }

    /// Turns the timing of every step on (clearing what was recorded) or off.
    pub(crate) fn set_profiling(&mut self, on: bool) {
        self.profile.set(on, self.steps.len());
    }

    /// Runs and time per node kind (fused nodes under their parts' kinds joined by
    /// `+`; a convolution's algorithm in brackets), since profiling was turned on.
    pub(crate) fn profile(&self) -> Vec<PartProfile> {
        self.profile.parts(|k| match self.steps.get(k) {
            Some(step) => match step.prepared.kernel.variant() {
                Some(v) => format!("{} ({v})", step.kind),
                None => step.kind.to_owned(),
            },
            None => String::new(),
        })
    }

    fn node_err(&self, s: &Step, message: String) -> XnnError {
        XnnError::Node {
            index: s.index,
            kind: s.kind,
            debug_handle: s.debug_handle,
            message,
        }
    }

    /// Infers every shape from the graph input shapes, then places values and sizes
    /// the arena and scratch memory.
    fn plan(&mut self, input_shapes: &[Dims]) -> Result<()> {
        for (e, s) in self.inputs.iter().zip(input_shapes) {
            if let Some(shape) = self.shapes.get_mut(e.value) {
                *shape = s.clone();
            }
        }
        let threads = self.pool.threads();
        let mut scratch = 0usize;
        for k in 0..self.steps.len() {
            let Some(step) = self.steps.get(k) else { break };
            let ins: SmallVec<[Option<Dims>; 5]> = step
                .inputs
                .iter()
                .map(|i| i.and_then(|i| self.shapes.get(i).cloned()))
                .collect();
            let mut outs: SmallVec<[Dims; 2]> = step
                .outputs
                .iter()
                .map(|&o| self.shapes.get(o).cloned().unwrap_or_default())
                .collect();
            let ins_ref: SmallVec<[Option<&[usize]>; 5]> =
                ins.iter().map(|d| d.as_deref()).collect();
            let result = self
                .steps
                .get_mut(k)
                .map(|s| s.prepared.kernel.reshape(&ins_ref, &mut outs));
            let step = self.steps.get(k).ok_or_else(|| XnnError::graph("step"))?;
            if let Some(Err(m)) = result {
                return Err(self.node_err(step, m));
            }
            for (&o, d) in step.outputs.iter().zip(outs) {
                if d.len() > crate::graph::MAX_DIMS {
                    return Err(self.node_err(step, format!("output rank {} exceeds 6", d.len())));
                }
                if let Some(s) = self.shapes.get_mut(o) {
                    *s = d;
                }
            }
            scratch = scratch.max(step.prepared.kernel.scratch_bytes(threads));
        }
        // Places: direct externals, then the arena for the rest of the non-constant
        // values, by lifetime (all placed anew: shapes or sharing may have changed).
        for p in &mut self.places {
            if !matches!(p, Place::Constant(_)) {
                *p = Place::None;
            }
        }
        for e in &self.inputs {
            if let Some(p) = self.places.get_mut(e.value) {
                *p = if e.direct {
                    Place::Input(e.arg)
                } else {
                    Place::None
                };
            }
        }
        for e in &self.outputs {
            if let Some(p) = self.places.get_mut(e.value) {
                *p = if e.direct {
                    Place::Output(e.arg)
                } else {
                    Place::None
                };
            }
        }
        let n = self.shapes.len();
        let mut first = vec![usize::MAX; n];
        let mut last = vec![0usize; n];
        let steps_len = self.steps.len();
        // Graph inputs converted into the arena live from the start; outputs converted
        // out of it live to the end.
        for e in self.inputs.iter().filter(|e| !e.direct) {
            if let Some(f) = first.get_mut(e.value) {
                *f = 0;
            }
        }
        for (k, s) in self.steps.iter().enumerate() {
            for &o in &s.outputs {
                if let Some(f) = first.get_mut(o) {
                    *f = (*f).min(k);
                }
                if let Some(l) = last.get_mut(o) {
                    *l = (*l).max(k);
                }
            }
            for &i in s.inputs.iter().flatten() {
                if let Some(l) = last.get_mut(i) {
                    *l = (*l).max(k);
                }
            }
        }
        for e in self.outputs.iter().filter(|e| !e.direct) {
            if let Some(l) = last.get_mut(e.value) {
                *l = steps_len;
            }
        }
        // A copy or reshape does not run when its output can share its input's memory:
        // an output that would take arena memory takes its input's (an arena value,
        // whose life then lasts as long as the output's, or a call input read in
        // place); an output written straight to the call's argument has its input
        // written there instead, if nothing else reads that input. Shufflenet's channel
        // shuffles copied 0.14 of 4.4 ms.
        let mut alias: Vec<usize> = (0..n).collect();
        self.elided.clear();
        self.elided.resize(steps_len, false);
        for (k, s) in self.steps.iter().enumerate() {
            let (Some(&Some(i)), Some(&o)) = (s.inputs.first(), s.outputs.first()) else {
                continue;
            };
            if !s.prepared.kernel.is_view() {
                continue;
            }
            if let Some(&Place::Output(arg)) = self.places.get(o) {
                let only_here = alias.get(i) == Some(&i)
                    && first.get(i).is_some_and(|&f| f != usize::MAX)
                    && last.get(i) == Some(&k)
                    && matches!(self.places.get(i), Some(Place::None));
                if only_here {
                    if let (Some(p), Some(e)) = (self.places.get_mut(i), self.elided.get_mut(k)) {
                        *p = Place::Output(arg);
                        *e = true;
                    }
                }
                continue;
            }
            if !matches!(self.places.get(o), Some(Place::None)) {
                continue;
            }
            let root = alias.get(i).copied().unwrap_or(i);
            let shares = match self.places.get(root) {
                Some(Place::None) => first.get(root).is_some_and(|&f| f != usize::MAX),
                Some(Place::Input(_)) => true,
                _ => false,
            };
            if !shares {
                continue;
            }
            let end = last.get(o).copied().unwrap_or(0);
            if let Some(l) = last.get_mut(root) {
                *l = (*l).max(end);
            }
            if let (Some(a), Some(f), Some(e)) =
                (alias.get_mut(o), first.get_mut(o), self.elided.get_mut(k))
            {
                *a = root;
                *f = usize::MAX;
                *e = true;
            }
        }
        // Every value a node writes, or an input converted in, needs memory.
        let mut needs: Vec<usize> = (0..n)
            .filter(|&v| {
                first.get(v).is_some_and(|&f| f != usize::MAX)
                    && matches!(self.places.get(v), Some(Place::None))
            })
            .collect();
        needs.sort_by_key(|&v| (first.get(v).copied(), v));
        let mut free: Vec<(usize, usize)> = Vec::new(); // (offset, len), sorted by offset
        let mut live: Vec<(usize, usize, usize)> = Vec::new(); // (last, offset, len)
        let mut top = 0usize;
        for &v in &needs {
            let start = first.get(v).copied().unwrap_or(0);
            // Release values whose last use is before this one's first.
            live.retain(|&(end, off, len)| {
                if end < start {
                    release(&mut free, off, len);
                    false
                } else {
                    true
                }
            });
            let shape = self.shapes.get(v).cloned().unwrap_or_default();
            let dtype = self.dtypes.get(v).copied().unwrap_or(Datatype::F32);
            let quant = self.quants.get(v).cloned().unwrap_or(Quant::None);
            let len = value_bytes(dtype, &quant, &shape)
                .and_then(|b| b.checked_add(ALIGN - 1))
                .map(|b| b / ALIGN * ALIGN)
                .ok_or_else(|| XnnError::graph(format!("value {v}: size overflows")))?;
            let offset = match free.iter().position(|&(_, l)| l >= len) {
                Some(k) => {
                    let (off, l) = free.get(k).copied().unwrap_or((0, 0));
                    if l == len {
                        free.remove(k);
                    } else if let Some(f) = free.get_mut(k) {
                        *f = (off + len, l - len);
                    }
                    off
                }
                None => {
                    // Extend the top, merging a free range that ends there.
                    match free.last().copied() {
                        Some((off, l)) if off + l == top => {
                            free.pop();
                            top = off + len;
                            off
                        }
                        _ => {
                            let off = top;
                            top = top
                                .checked_add(len)
                                .ok_or_else(|| XnnError::graph("arena size overflows"))?;
                            off
                        }
                    }
                }
            };
            live.push((last.get(v).copied().unwrap_or(0), offset, len));
            if let Some(p) = self.places.get_mut(v) {
                *p = Place::Arena { offset, len };
            }
        }
        for (v, &root) in alias.iter().enumerate() {
            if root != v {
                let place = self.places.get(root).copied().unwrap_or(Place::None);
                if let Some(p) = self.places.get_mut(v) {
                    *p = place;
                }
            }
        }
        self.workspace.reserve(top, scratch).map_err(|e| {
            // Name the largest value and the node producing it.
            let largest = needs.iter().copied().max_by_key(|&v| {
                let d = self.dtypes.get(v).copied().unwrap_or(Datatype::F32);
                let q = self.quants.get(v).cloned().unwrap_or(Quant::None);
                value_bytes(d, &q, self.shapes.get(v).map_or(&[][..], |s| s.as_slice()))
            });
            let what = match largest.and_then(|v| {
                let step = self.steps.iter().find(|s| s.outputs.contains(&v))?;
                Some((v, step))
            }) {
                Some((v, s)) => format!(
                    "delegate arena (largest value: output {:?} of node {} ({}, debug handle {}))",
                    self.shapes.get(v).map(|d| d.as_slice()).unwrap_or_default(),
                    s.index,
                    s.kind,
                    s.debug_handle
                ),
                None => "delegate arena".to_owned(),
            };
            storage_err(&format!("{what} or scratch memory ({scratch} bytes)"), e)
        })?;
        self.planned_for = input_shapes.to_vec();
        Ok(())
    }

    /// Runs the graph on a delegate call's arguments.
    pub(crate) fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        // Input shapes in physical (dim-order) layout, as XNNPACK's executor gives them;
        // compared in place with the planned ones (no allocation when they agree).
        let physical = |args: &Args<'_>, arg: usize| -> KernelResult<Dims> {
            let t = args.info(arg)?;
            Ok(t.dim_order
                .iter()
                .map(|&d| t.sizes.get(d).copied().unwrap_or(0))
                .collect())
        };
        let mut same = self.inputs.len() == self.planned_for.len();
        for (e, planned) in self.inputs.iter().zip(&self.planned_for) {
            same &= physical(args, e.arg)? == *planned;
        }
        if !same {
            let shapes = self
                .inputs
                .iter()
                .map(|e| physical(args, e.arg))
                .collect::<KernelResult<Vec<Dims>>>()?;
            self.plan(&shapes)?;
        }
        // Outputs take the shapes the graph gives them (back in their dim order).
        for e in &self.outputs {
            let t = args.info(e.arg)?;
            let mut shape = self.shapes.get(e.value).cloned().unwrap_or_default();
            // A 0-d argument is a one-element value of the graph (upstream serializes
            // scalars with dims [1]).
            if t.sizes.is_empty() && checked_numel(&shape) == Some(1) {
                shape.clear();
            }
            if shape.len() != t.sizes.len() {
                return Err(KernelError::invalid(format!(
                    "output argument {} has rank {}, the graph gives {shape:?}",
                    e.arg,
                    t.sizes.len()
                )));
            }
            let mut sizes: Dims = shape.clone();
            for (j, &d) in t.dim_order.iter().enumerate() {
                if let (Some(s), Some(&v)) = (sizes.get_mut(d), shape.get(j)) {
                    *s = v;
                }
            }
            args.resize(e.arg, &sizes)?;
        }
        if self.inputs.len() <= INLINE_READS && self.outputs.len() <= INLINE_WRITES {
            self.run_steps::<INLINE_READS, INLINE_WRITES>(args)
        } else {
            self.run_steps::<MANY_READS, MANY_WRITES>(args)
        }
    }

    /// Runs the nodes on the call's data, with views of up to `R` inputs and `W`
    /// outputs held inline.
    fn run_steps<const R: usize, const W: usize>(&mut self, args: &mut Args<'_>) -> KernelResult {
        let reads: SmallVec<[Arg; R]> = self.inputs.iter().map(|e| Arg::At(e.arg)).collect();
        let writes: SmallVec<[Arg; W]> = self.outputs.iter().map(|e| Arg::At(e.arg)).collect();
        let mut io = args.io_many::<R, W>(&reads, &writes)?;
        let ins: SmallVec<[&[u8]; R]> = io.inputs.iter().map(|t| t.bytes()).collect();
        let mut outs: SmallVec<[&mut [u8]; W]> =
            io.outputs.iter_mut().map(|t| t.bytes_mut()).collect();
        let mut work = self.workspace.lock();
        let pte_runtime::WorkBuffers { arena, scratch } = &mut *work;
        let arena = arena.as_mut_bytes();
        // Inputs that cross the boundary converted.
        for (k, e) in self.inputs.iter().enumerate() {
            if e.direct {
                continue;
            }
            let (Some(Place::Arena { offset, len }), Some(src)) =
                (self.places.get(e.value), ins.get(k))
            else {
                continue;
            };
            let dst = arena
                .get_mut(*offset..offset + len)
                .ok_or_else(|| KernelError::Failed("arena too small".into()))?;
            convert_in(e.dtype, src, dst)?;
        }
        let arg_of_input: SmallVec<[usize; R]> = self.inputs.iter().map(|e| e.arg).collect();
        let arg_of_output: SmallVec<[usize; W]> = self.outputs.iter().map(|e| e.arg).collect();
        for (k, step) in self.steps.iter().enumerate() {
            if self.elided.get(k) == Some(&true) {
                continue;
            }
            let started = self.profile.start();
            let mut cx = Cx {
                pool: &self.pool,
                scratch,
            };
            let result = run_step(
                step,
                &self.places,
                &self.shapes,
                &self.constants,
                &ins,
                &arg_of_input,
                &mut outs,
                &arg_of_output,
                arena,
                &mut cx,
            );
            if let Err(m) = result {
                return Err(XnnError::Node {
                    index: step.index,
                    kind: step.kind,
                    debug_handle: step.debug_handle,
                    message: m,
                }
                .into());
            }
            self.profile.record(k, started);
        }
        for (k, e) in self.outputs.iter().enumerate() {
            if e.direct {
                continue;
            }
            let (Some(Place::Arena { offset, len }), Some(dst)) =
                (self.places.get(e.value), outs.get_mut(k))
            else {
                continue;
            };
            let src = arena
                .get(*offset..offset + len)
                .ok_or_else(|| KernelError::Failed("arena too small".into()))?;
            convert_out(e.dtype, src, dst)?;
        }
        Ok(())
    }
}

/// Gives `len` bytes at `off` back to the sorted free list, merging neighbours.
fn release(free: &mut Vec<(usize, usize)>, off: usize, len: usize) {
    let k = free.partition_point(|&(o, _)| o < off);
    free.insert(k, (off, len));
    // Merge with the next, then with the previous.
    if let (Some(&(o, l)), Some(&(o2, l2))) = (free.get(k), free.get(k + 1)) {
        if o + l == o2 {
            if let Some(f) = free.get_mut(k) {
                *f = (o, l + l2);
            }
            free.remove(k + 1);
        }
    }
    if k > 0 {
        if let (Some(&(o0, l0)), Some(&(o, l))) = (free.get(k - 1), free.get(k)) {
            if o0 + l0 == o {
                if let Some(f) = free.get_mut(k - 1) {
                    *f = (o0, l0 + l);
                }
                free.remove(k);
            }
        }
    }
}

/// Converts a float constant to f32, or copies another constant, into aligned memory
/// charged to the budget.
fn materialize(
    dtype: Datatype,
    bytes: &[u8],
    budget: &MemoryBudget,
) -> std::result::Result<Buffer, String> {
    let mut buf = Buffer::new(budget);
    match dtype {
        Datatype::F16 | Datatype::Bf16 => {
            let n = bytes.len() / 2;
            let out = buf
                .slice_mut::<f32>(n)
                .map_err(|e| format!("materializing the constant: {e}"))?;
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                let bits = u16::from_le_bytes([
                    b.first().copied().unwrap_or(0),
                    b.get(1).copied().unwrap_or(0),
                ]);
                *o = if dtype == Datatype::F16 {
                    f16::from_bits(bits).to_f32()
                } else {
                    bf16::from_bits(bits).to_f32()
                };
            }
        }
        _ => {
            buf.resize(bytes.len())
                .map_err(|e| format!("materializing the constant: {e}"))?;
            buf.as_mut_bytes().copy_from_slice(bytes);
        }
    }
    Ok(buf)
}

fn convert_in(dtype: DType, src: &[u8], dst: &mut [u8]) -> KernelResult {
    let dst: &mut [f32] = bytemuck::try_cast_slice_mut(dst)
        .map_err(|e| KernelError::Failed(format!("arena misaligned: {e}")))?;
    match dtype {
        DType::F16 | DType::BF16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                let bits = u16::from_le_bytes([
                    b.first().copied().unwrap_or(0),
                    b.get(1).copied().unwrap_or(0),
                ]);
                *o = if dtype == DType::F16 {
                    f16::from_bits(bits).to_f32()
                } else {
                    bf16::from_bits(bits).to_f32()
                };
            }
            Ok(())
        }
        other => Err(KernelError::Failed(format!("no conversion from {other}"))),
    }
}

fn convert_out(dtype: DType, src: &[u8], dst: &mut [u8]) -> KernelResult {
    match dtype {
        DType::F16 | DType::BF16 => {
            let src: &[f32] = bytemuck::try_cast_slice(src)
                .map_err(|e| KernelError::Failed(format!("arena misaligned: {e}")))?;
            for (o, &v) in dst.chunks_exact_mut(2).zip(src) {
                let bits = if dtype == DType::F16 {
                    f16::from_f32(v).to_bits()
                } else {
                    bf16::from_f32(v).to_bits()
                };
                o.copy_from_slice(&bits.to_le_bytes());
            }
            Ok(())
        }
        DType::I64 => {
            let src: &[i32] = bytemuck::try_cast_slice(src)
                .map_err(|e| KernelError::Failed(format!("arena misaligned: {e}")))?;
            for (o, &v) in dst.chunks_exact_mut(8).zip(src) {
                o.copy_from_slice(&i64::from(v).to_le_bytes());
            }
            Ok(())
        }
        other => Err(KernelError::Failed(format!("no conversion to {other}"))),
    }
}

/// Runs one node: views of its data, the kernel, rounding of fp16/bf16 outputs.
#[allow(clippy::too_many_arguments)]
fn run_step(
    step: &Step,
    places: &[Place],
    shapes: &[Dims],
    constants: &[Buffer],
    ins: &[&[u8]],
    arg_of_input: &[usize],
    outs: &mut [&mut [u8]],
    arg_of_output: &[usize],
    arena: &mut [u8],
    cx: &mut Cx<'_>,
) -> std::result::Result<(), String> {
    let place = |v: usize| places.get(v).copied().unwrap_or(Place::None);
    // Arena ranges written by this node, sorted, then carved out of the arena; reads
    // come from what is left between them.
    let mut writes: SmallVec<[(usize, usize, usize); 2]> = SmallVec::new(); // (offset, len, k)
    let mut out_args: SmallVec<[(usize, usize); 2]> = SmallVec::new(); // (position in outs, k)
    for (k, &o) in step.outputs.iter().enumerate() {
        match place(o) {
            Place::Arena { offset, len } => writes.push((offset, len, k)),
            Place::Output(arg) => {
                let pos = arg_of_output
                    .iter()
                    .position(|&a| a == arg)
                    .ok_or("output argument missing")?;
                out_args.push((pos, k));
            }
            _ => return Err(format!("output {k} has no memory")),
        }
    }
    writes.sort_unstable();
    let mut gaps: SmallVec<[(usize, &[u8]); 4]> = SmallVec::new();
    let mut out_views: SmallVec<[Option<&mut [u8]>; 2]> =
        (0..step.outputs.len()).map(|_| None).collect();
    let mut rest: &mut [u8] = arena;
    let mut base = 0usize;
    for &(off, len, k) in &writes {
        let skip = off.checked_sub(base).ok_or("overlapping outputs")?;
        let (gap, tail) = std::mem::take(&mut rest)
            .split_at_mut_checked(skip)
            .ok_or("arena too small")?;
        gaps.push((base, &*gap));
        let (w, tail) = tail.split_at_mut_checked(len).ok_or("arena too small")?;
        if let Some(slot) = out_views.get_mut(k) {
            *slot = Some(w);
        }
        rest = tail;
        base = off + len;
    }
    gaps.push((base, &*rest));
    // Call outputs: the ones this node writes exclusively, and the ones it reads (only
    // those listed, so that a call with many outputs does not outgrow the inline list).
    let reads_output = |pos: usize| {
        step.inputs.iter().flatten().any(
            |&v| matches!(place(v), Place::Output(arg) if arg_of_output.get(pos) == Some(&arg)),
        )
    };
    let mut readable_outs: SmallVec<[(usize, &[u8]); 4]> = SmallVec::new();
    for (pos, o) in outs.iter_mut().enumerate() {
        match out_args.iter().find(|&&(p, _)| p == pos) {
            Some(&(_, k)) => {
                if let Some(slot) = out_views.get_mut(k) {
                    *slot = Some(&mut **o);
                }
            }
            None if reads_output(pos) => readable_outs.push((pos, &**o)),
            None => {}
        }
    }
    let mut in_views: SmallVec<[Option<In<'_>>; 5]> = SmallVec::new();
    for (pos, &input) in step.inputs.iter().enumerate() {
        let Some(v) = input else {
            in_views.push(None);
            continue;
        };
        if step.prepared.captures(pos) {
            in_views.push(None);
            continue;
        }
        let dims = shapes.get(v).map(|d| d.as_slice()).unwrap_or_default();
        let bytes: &[u8] = match place(v) {
            Place::Input(arg) => {
                let k = arg_of_input
                    .iter()
                    .position(|&a| a == arg)
                    .ok_or("input missing")?;
                ins.get(k).copied().ok_or("input missing")?
            }
            Place::Output(arg) => {
                let k = arg_of_output
                    .iter()
                    .position(|&a| a == arg)
                    .ok_or("output missing")?;
                readable_outs
                    .iter()
                    .find(|&&(p, _)| p == k)
                    .map(|&(_, b)| b)
                    .ok_or("an output read while written")?
            }
            Place::Constant(c) => constants
                .get(c)
                .map(Buffer::as_bytes)
                .ok_or("constant missing")?,
            Place::Arena { offset, len } => gaps
                .iter()
                .find(|&&(start, g)| offset >= start && offset + len <= start + g.len())
                .and_then(|&(start, g)| g.get(offset - start..offset - start + len))
                .ok_or("an input overlaps an output in the arena")?,
            Place::None => return Err(format!("input {pos} has no memory")),
        };
        in_views.push(Some(In { bytes, dims }));
    }
    let mut out_list: SmallVec<[Out<'_>; 2]> = SmallVec::new();
    for (k, view) in out_views.into_iter().enumerate() {
        let o = step.outputs.get(k).copied().unwrap_or(0);
        let dims = shapes.get(o).map(|d| d.as_slice()).unwrap_or_default();
        out_list.push(Out {
            bytes: view.ok_or("output view missing")?,
            dims,
        });
    }
    step.prepared.kernel.run(cx, &in_views, &mut out_list)?;
    for &(o, dtype) in &step.round {
        let k = step.outputs.iter().position(|&x| x == o).unwrap_or(0);
        if let Some(out) = out_list.get_mut(k) {
            let numel = checked_numel(out.dims).unwrap_or(0);
            let data: &mut [f32] = bytemuck::try_cast_slice_mut(&mut *out.bytes)
                .map_err(|e| format!("output misaligned: {e}"))?;
            let data = data.get_mut(..numel).unwrap_or_default();
            round_float(dtype, data);
        }
    }
    Ok(())
}

/// Rounds f32 values to fp16 or bf16 precision in place.
pub(crate) fn round_float(dtype: Datatype, data: &mut [f32]) {
    match dtype {
        Datatype::F16 => data
            .iter_mut()
            .for_each(|v| *v = f16::from_f32(*v).to_f32()),
        Datatype::Bf16 => data
            .iter_mut()
            .for_each(|v| *v = bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}
