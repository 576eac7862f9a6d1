//! A loaded method: its values, planned memory, prepared kernels and delegates, and the
//! instruction loop.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pte_compute::ThreadPool;
use pte_format::schema::executorch_flatbuffer as et;
use pte_format::{summary::operator_name, Ptd, Pte};

use crate::args::{resize_slot, Args, TensorInfo};
use crate::budget::{default_memory_limit, MemoryBudget};
use crate::dtype::DType;
use crate::error::{KernelError, Result, RuntimeError};
use crate::memory::{Access, Memory, SharedBytes, Storage};
use crate::program::{tensor_shape, MethodMeta, Program};
use crate::registry::{
    ArgDecl, BackendRegistry, DelegateCall, DelegateInit, KernelRegistry, NamedData, PreparedKernel,
};
use crate::tensor::Tensor;
use crate::value::{EValue, Slot, TensorSlot};

/// Most instructions one execution may run (upstream's `ET_MAX_INSTRUCTIONS`).
pub const MAX_INSTRUCTIONS: u64 = 10_000_000;

/// Loops in a program (jumps back) may run at least this many iterations per execution;
/// see [`LoadOptions::max_loop_iterations`].
pub const MIN_LOOP_ITERATIONS: u64 = 1024;

/// Choices for loading a method.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Most bytes the method may hold allocated at once: planned buffers, tensors that are
    /// not memory-planned, kernel working memory and copies, state that kernels and
    /// delegates prepare at load. Exceeding it is an error naming what asked for how
    /// much. Defaults to [`default_memory_limit`] (half of the memory the process may
    /// use).
    pub memory_limit: u64,
    /// Run kernels and delegates on a thread pool of their own with this many threads
    /// (the calling thread included; 1 runs everything inline); `None` shares one
    /// process-wide pool with a thread per available CPU. While a method executes, the
    /// pool's other threads wait for work spinning, not asleep (they would wake too
    /// late for the next parallel call): each keeps a CPU busy until the execution ends.
    pub threads: Option<usize>,
    /// Stop an execution with an error after this many instructions (upstream's cap by
    /// default).
    pub max_instructions: u64,
    /// Stop an execution with an error after this many jumps back (loop iterations).
    /// `None` (the default) allows as many as the largest dimension of any tensor that
    /// holds data (planned, constant, or an input as set), and at least
    /// [`MIN_LOOP_ITERATIONS`]: the loops upstream emits (`torch.map`, `scan`) iterate
    /// over a dimension of such a tensor, while a hostile loop stops after that many
    /// passes over its body.
    pub max_loop_iterations: Option<u64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            memory_limit: default_memory_limit(),
            threads: None,
            max_instructions: MAX_INSTRUCTIONS,
            max_loop_iterations: None,
        }
    }
}

/// The pool methods share when [`LoadOptions::threads`] is `None`: one thread per
/// available CPU, created on first use. Methods running at once on several threads
/// share it; a job that finds it busy runs on its caller alone.
fn shared_pool() -> Result<Arc<ThreadPool>> {
    static POOL: OnceLock<Arc<ThreadPool>> = OnceLock::new();
    if let Some(pool) = POOL.get() {
        return Ok(Arc::clone(pool));
    }
    let pool = ThreadPool::with_available_parallelism()
        .map_err(|e| RuntimeError::NotSupported(format!("thread pool: {e}")))?;
    Ok(Arc::clone(POOL.get_or_init(|| Arc::new(pool))))
}

/// Stops a method's executions from another thread (see [`Method::cancel_handle`]).
#[derive(Clone, Debug, Default)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Makes the execution under way (or the next one) stop with
    /// [`RuntimeError::Cancelled`] before its next instruction.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

pub(crate) enum Instr {
    /// An instruction whose work was done at load (constant folding).
    Nop,
    Kernel {
        kernel: u32,
        op: u32,
        args: Range<u32>,
    },
    Delegate {
        delegate: u32,
        args: Range<u32>,
    },
    Move {
        from: u32,
        to: u32,
    },
    JumpFalse {
        cond: u32,
        destination: usize,
    },
    Free {
        value: u32,
    },
}

/// A method ready to run. It owns its memory; mutable state (buffers a program updates in
/// place) persists from one execution to the next.
pub struct Method {
    meta: MethodMeta,
    values: Vec<Slot>,
    memory: Memory,
    chains: Vec<Vec<Instr>>,
    call_args: Vec<u32>,
    op_names: Vec<String>,
    /// Prepared kernels by call site; `None` for calls folded at load.
    kernels: Vec<Option<Box<dyn PreparedKernel>>>,
    delegates: Vec<(String, Box<dyn PreparedKernel>)>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    input_set: Vec<bool>,
    /// The pool kernels and delegates split their work on (see [`Args::pool`]).
    compute_pool: Arc<ThreadPool>,
    max_instructions: u64,
    max_loop_iterations: Option<u64>,
    /// Largest dimension of any planned or constant tensor (for the default loop limit).
    largest_dim: usize,
    timeout: Option<Duration>,
    cancel: CancelHandle,
    /// Calls and time per instruction (chain-major), when profiling is on.
    profile: Option<Vec<Vec<(u64, Duration)>>>,
}

/// Time spent in one operator or delegate over the executions profiled.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileEntry {
    /// The operator name, or `delegate <backend>` for a delegate call.
    pub name: String,
    /// True for delegate calls.
    pub delegate: bool,
    /// Instructions executed.
    pub calls: u64,
    /// Time spent in them.
    pub total: Duration,
    /// The time in its parts, most expensive first, if it times them: a delegate's
    /// graph by node kind, a fused kernel's steps.
    pub parts: Vec<crate::PartProfile>,
}

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Method").field("meta", &self.meta).finish()
    }
}

/// The profile's name for a backend's delegate calls.
fn delegate_entry_name(backend: &str) -> String {
    format!("delegate {backend}")
}

fn bad(message: impl Into<String>) -> RuntimeError {
    RuntimeError::invalid_program(message)
}

/// Offset of `inner` inside `outer` (a view the format crate gave of that file).
fn offset_in(outer: &[u8], inner: &[u8]) -> Result<usize> {
    let offset = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize);
    offset
        .filter(|o| {
            o.checked_add(inner.len())
                .is_some_and(|end| end <= outer.len())
        })
        .ok_or_else(|| bad("tensor data lies outside its file"))
}

fn value_index(v: i64, n: usize, what: impl Fn() -> String) -> Result<u32> {
    usize::try_from(v)
        .ok()
        .filter(|&i| i < n)
        .map(|i| i as u32)
        .ok_or_else(|| {
            bad(format!(
                "{}: value index {v} is out of range (0..{n})",
                what()
            ))
        })
}

/// A named entry's file (`None`: the program, else a `.ptd`) and bytes, by key.
type NameIndex<'p> = HashMap<&'p str, (Option<usize>, &'p [u8])>;

struct DataNames<'p> {
    program: &'p Program,
    pte: &'p Pte<'p>,
    ptds: &'p [Ptd<'p>],
    /// Every key and where its bytes are, the first of each key in lookup order (the
    /// `.ptd` files, then the program), built on the first lookup: a scan per lookup
    /// made loading quadratic in the number of named constants.
    index: OnceLock<NameIndex<'p>>,
}

impl<'p> DataNames<'p> {
    fn index(&self) -> &NameIndex<'p> {
        self.index.get_or_init(|| {
            let mut index = HashMap::new();
            for (i, ptd) in self.ptds.iter().enumerate() {
                for e in ptd.entries().unwrap_or_default() {
                    index.entry(e.key).or_insert((Some(i), e.data));
                }
            }
            for (key, data) in self.pte.named_data_entries().unwrap_or_default() {
                index.entry(key).or_insert((None, data));
            }
            index
        })
    }
}

impl NamedData for DataNames<'_> {
    fn get(&self, key: &str) -> Option<SharedBytes> {
        let &(file, data) = self.index().get(key)?;
        let source = match file {
            Some(i) => self.program.data.get(i)?,
            None => &self.program.bytes,
        };
        SharedBytes::within(source, data)
    }
}

impl Method {
    pub(crate) fn load(
        program: &Program,
        name: &str,
        kernels: &KernelRegistry,
        backends: &BackendRegistry,
        options: &LoadOptions,
    ) -> Result<Method> {
        let pte = program.pte()?;
        let plan = program.plan(&pte, name)?;
        let meta = MethodMeta::from_plan(plan)?;
        let ptds = program.ptds()?;
        let compute_pool = match options.threads {
            Some(t) => Arc::new(
                ThreadPool::new(t)
                    .map_err(|e| RuntimeError::NotSupported(format!("thread pool: {e}")))?,
            ),
            None => shared_pool()?,
        };

        // Planned memory, charged to the method's budget first.
        let budget = MemoryBudget::new(options.memory_limit);
        let n_values = plan.values()?.map_or(0, |v| v.len());
        let mut memory = Memory::new(
            budget,
            &meta.planned_buffers,
            program.bytes.clone(),
            program.data.clone(),
            n_values,
        )
        .map_err(|(id, source)| RuntimeError::Memory {
            what: format!("method {name}: planned buffer {id} ({} bytes)", {
                meta.planned_buffers.get(id - 1).copied().unwrap_or(0)
            }),
            source,
        })?;

        let values = parse_values(&pte, plan, &ptds, program, &mut memory)?;
        let n = values.len();
        let list = |v: Option<planus::Vector<'_, i32>>, what: &str| -> Result<Vec<u32>> {
            v.ok_or_else(|| bad(format!("method {name}: no {what} list")))?
                .iter()
                .enumerate()
                .map(|(k, i)| value_index(i.into(), n, || format!("{what} {k}")))
                .collect()
        };
        let inputs = list(plan.inputs()?, "input")?;
        let outputs = list(plan.outputs()?, "output")?;

        // Operators and delegates.
        let mut op_names = Vec::new();
        for op in plan.operators()?.into_iter().flatten() {
            let op = op?;
            op_names.push(operator_name(
                op.name()?.unwrap_or_default(),
                op.overload()?.unwrap_or_default(),
            ));
        }
        let delegate_refs: Vec<et::BackendDelegateRef<'_>> = plan
            .delegates()?
            .ok_or_else(|| bad(format!("method {name}: no delegates list")))?
            .iter()
            .collect::<planus::Result<_>>()?;
        // Instructions.
        let chains_ref = plan
            .chains()?
            .ok_or_else(|| bad(format!("method {name}: no chains")))?;
        if chains_ref.is_empty() {
            return Err(bad(format!("method {name}: no chains")));
        }
        let mut call_args = Vec::new();
        let mut chains = Vec::new();
        let mut kernel_calls = Vec::new();
        for (c, chain) in chains_ref.iter().enumerate() {
            let chain = chain?;
            let instrs = chain
                .instructions()?
                .ok_or_else(|| bad(format!("chain {c} has no instructions list")))?;
            let mut out = Vec::with_capacity(instrs.len());
            for (k, instr) in instrs.iter().enumerate() {
                let at = || format!("chain {c} instruction {k}");
                let mut push_args = |args: Option<planus::Vector<'_, i32>>| -> Result<Range<u32>> {
                    let start = call_args.len() as u32;
                    for a in args.into_iter().flatten() {
                        call_args.push(value_index(a.into(), n, at)?);
                    }
                    Ok(start..call_args.len() as u32)
                };
                use et::InstructionArgumentsRef as I;
                out.push(match instr?.instr_args()? {
                    Some(I::KernelCall(kc)) => {
                        let op = kc.op_index()?;
                        let op = usize::try_from(op)
                            .ok()
                            .filter(|&o| o < op_names.len())
                            .ok_or_else(|| {
                                bad(format!("{}: operator index {op} is out of range", at()))
                            })?;
                        let args = push_args(kc.args()?)?;
                        kernel_calls.push((op, args.clone()));
                        Instr::Kernel {
                            kernel: (kernel_calls.len() - 1) as u32,
                            op: op as u32,
                            args,
                        }
                    }
                    Some(I::DelegateCall(dc)) => {
                        let d = dc.delegate_index()?;
                        let d = usize::try_from(d)
                            .ok()
                            .filter(|&x| x < delegate_refs.len())
                            .ok_or_else(|| {
                                bad(format!("{}: delegate index {d} is out of range", at()))
                            })?;
                        Instr::Delegate {
                            delegate: d as u32,
                            args: push_args(dc.args()?)?,
                        }
                    }
                    Some(I::MoveCall(m)) => Instr::Move {
                        from: value_index(m.move_from()?.into(), n, at)?,
                        to: value_index(m.move_to()?.into(), n, at)?,
                    },
                    Some(I::JumpFalseCall(j)) => {
                        let dest = j.destination_instruction()?;
                        Instr::JumpFalse {
                            cond: value_index(j.cond_value_index()?.into(), n, at)?,
                            destination: usize::try_from(dest).map_err(|_| {
                                bad(format!("{}: jump destination {dest} is negative", at()))
                            })?,
                        }
                    }
                    Some(I::FreeCall(f)) => Instr::Free {
                        value: value_index(f.value_index()?.into(), n, at)?,
                    },
                    None => return Err(bad(format!("{}: instruction has no arguments", at()))),
                });
            }
            chains.push(out);
        }

        let mut missing: Vec<String> = op_names
            .iter()
            .filter(|n| kernels.get(n).is_none())
            .cloned()
            .collect();
        missing.sort();
        missing.dedup();
        let mut missing_backends = Vec::new();
        for d in &delegate_refs {
            let id = d.id()?.unwrap_or_default();
            if backends.get(id).is_none() && !missing_backends.iter().any(|m| m == id) {
                missing_backends.push(id.to_owned());
            }
        }
        if !missing.is_empty() {
            return Err(RuntimeError::MissingOperators(missing));
        }
        if !missing_backends.is_empty() {
            return Err(RuntimeError::MissingBackends(missing_backends));
        }

        let mut values = values;
        // Delegates.
        let names = DataNames {
            program,
            pte: &pte,
            ptds: &ptds,
            index: OnceLock::new(),
        };
        // Each delegate's calls, with their arguments as declared.
        let mut calls: Vec<Vec<DelegateCall>> = vec![Vec::new(); delegate_refs.len()];
        for (c, chain) in chains.iter().enumerate() {
            for (k, instr) in chain.iter().enumerate() {
                let Instr::Delegate { delegate, args } = instr else {
                    continue;
                };
                let args = call_args
                    .get(args.start as usize..args.end as usize)
                    .unwrap_or_default()
                    .iter()
                    .map(|&v| match values.get(v as usize) {
                        Some(Slot::Tensor(t)) => ArgDecl::Tensor {
                            info: crate::TensorInfo {
                                dtype: t.info.dtype,
                                sizes: t.info.sizes.clone(),
                                dim_order: t.info.dim_order.clone(),
                            },
                            dynamism: t.dynamism,
                        },
                        Some(other) => ArgDecl::Other(other.kind()),
                        None => ArgDecl::Other("missing"),
                    })
                    .collect();
                if let Some(list) = calls.get_mut(*delegate as usize) {
                    list.push(DelegateCall {
                        chain: c,
                        instruction: k,
                        args,
                    });
                }
            }
        }
        let mut delegates = Vec::with_capacity(delegate_refs.len());
        let workspace = crate::Workspace::new(&memory.budget);
        // What delegates and kernels derive from constants, shared until all are prepared.
        let derived = crate::DerivedStates::default();
        for (i, d) in delegate_refs.iter().enumerate() {
            let id = d.id()?.unwrap_or_default().to_owned();
            let processed = d
                .processed()?
                .ok_or_else(|| bad(format!("delegate {i} ({id}) has no payload reference")))?;
            let processed = SharedBytes::within(&program.bytes, pte.delegate_data(processed)?)
                .ok_or_else(|| bad(format!("delegate {i} ({id}): payload outside the program")))?;
            let mut specs = Vec::new();
            for s in d.compile_specs()?.into_iter().flatten() {
                let s = s?;
                specs.push((
                    s.key()?.unwrap_or_default().to_owned(),
                    s.value()?.unwrap_or_default().to_vec(),
                ));
            }
            let init = DelegateInit {
                index: i,
                processed,
                compile_specs: &specs,
                named_data: &names,
                budget: &memory.budget,
                pool: &compute_pool,
                workspace: &workspace,
                derived: &derived,
                calls: calls.get(i).map_or(&[], Vec::as_slice),
            };
            let first = init.calls.first();
            let failed = |source| RuntimeError::Delegate {
                index: i,
                backend: id.clone(),
                chain: first.map_or(0, |c| c.chain),
                instruction: first.map_or(0, |c| c.instruction),
                source,
            };
            let backend = backends
                .get(&id)
                .ok_or_else(|| RuntimeError::MissingBackends(vec![id.clone()]))?;
            let handle = backend.init(&init).map_err(failed)?;
            delegates.push((id, handle));
        }

        let delegate_writes: Vec<Option<Vec<usize>>> = delegates
            .iter()
            .map(|(_, d)| d.written().map(<[usize]>::to_vec))
            .collect();
        // Calls computing only from constants run now, once; those a fusion may read
        // through wait for the fusions (below), then fold if none took them.
        let io: Vec<u32> = inputs.iter().chain(&outputs).copied().collect();
        let deferred =
            crate::fuse::deferred_folds(kernels, &chains, &call_args, &op_names, &values, &io);
        let mut viewed = crate::fold::fold_constants(
            &deferred,
            &mut chains,
            &crate::alias::Method {
                call_args: &call_args,
                op_names: &op_names,
                kernels,
                fused_from: op_names.len(),
                io: &io,
                delegate_writes: &delegate_writes,
            },
            &mut values,
            &mut memory,
            &inputs,
            &compute_pool,
        );

        // Groups of calls the registry's fuser proposes, and the runtime finds safe, run
        // as one call.
        let fusions = crate::fuse::plan(
            kernels, &chains, &call_args, &op_names, &values, &io, &viewed, &memory,
        );
        let mut fused_kernels: Vec<Option<Arc<dyn crate::Kernel>>> = vec![None; kernel_calls.len()];
        let fused_from = op_names.len();
        for f in fusions {
            let start = call_args.len() as u32;
            call_args.extend_from_slice(&f.args);
            let args = start..call_args.len() as u32;
            op_names.push(f.name);
            let op = op_names.len() - 1;
            for (k, c) in [f.first].iter().chain(&f.rest).enumerate() {
                let Some(instr) = chains
                    .get_mut(c.chain)
                    .and_then(|ch| ch.get_mut(c.instruction))
                else {
                    continue;
                };
                let Instr::Kernel { kernel, .. } = *instr else {
                    continue;
                };
                if k == 0 {
                    *instr = Instr::Kernel {
                        kernel,
                        op: op as u32,
                        args: args.clone(),
                    };
                    if let Some(site) = kernel_calls.get_mut(kernel as usize) {
                        *site = (op, args.clone());
                    }
                    if let Some(slot) = fused_kernels.get_mut(kernel as usize) {
                        *slot = Some(f.kernel.clone());
                    }
                } else {
                    *instr = Instr::Nop;
                    if let Some(site) = kernel_calls.get_mut(kernel as usize) {
                        *site = (op, 0..0);
                    }
                }
            }
        }
        // The method as fused: fused calls count as pure (they group pure calls only).
        let fused = crate::alias::Method {
            call_args: &call_args,
            op_names: &op_names,
            kernels,
            fused_from,
            io: &io,
            delegate_writes: &delegate_writes,
        };
        if !deferred.is_empty() {
            let late = crate::fold::fold_constants(
                &[],
                &mut chains,
                &fused,
                &mut values,
                &mut memory,
                &inputs,
                &compute_pool,
            );
            viewed.merge(&late);
        }
        // Copies that move no data.
        crate::alias::elide(&mut chains, &mut values, &mut viewed, &fused, &mut memory).map_err(
            |source| RuntimeError::Memory {
                what: format!("method {name}: inputs of elided copies, moved out of the plan"),
                source,
            },
        )?;
        let unused: Vec<bool> = chains_calls_unused(&chains, kernel_calls.len());

        // The other kernels, prepared once per call site.
        let staging = pte_compute::Staging::new();
        let mut prepared = Vec::with_capacity(kernel_calls.len());
        for (k, (op, args)) in kernel_calls.iter().enumerate() {
            if unused.get(k) != Some(&false) {
                prepared.push(None);
                continue;
            }
            let op_name = op_names.get(*op).map_or("?", String::as_str);
            let kernel = match fused_kernels.get(k).cloned().flatten() {
                Some(f) => f,
                None => kernels
                    .get(op_name)
                    .cloned()
                    .ok_or_else(|| RuntimeError::MissingOperators(vec![op_name.to_owned()]))?,
            };
            let a = Args {
                op: op_name,
                ids: call_args
                    .get(args.start as usize..args.end as usize)
                    .unwrap_or_default(),
                values: &mut values,
                memory: &mut memory,
                pool: &compute_pool,
                staging: &staging,
                derived: Some(&derived),
            };
            prepared.push(Some(kernel.prepare(&a).map_err(|source| {
                RuntimeError::Kernel {
                    op: op_name.to_owned(),
                    chain: 0,
                    instruction: 0,
                    source,
                }
            })?));
        }

        drop((staging, derived));
        crate::fold::release_consumed(&chains, &call_args, &mut values, &prepared, &mut memory);

        let largest_dim = values
            .iter()
            .filter_map(|v| match v {
                Slot::Tensor(t) if t.storage != Storage::Null && t.numel() > 0 => {
                    t.info.sizes.iter().max().copied()
                }
                _ => None,
            })
            .max()
            .unwrap_or(0);
        // As upstream, every input must be set before the first execution.
        let input_set = vec![false; inputs.len()];
        pte_alloc::trim_shared();
        Ok(Method {
            meta,
            values,
            memory,
            chains,
            call_args,
            op_names,
            kernels: prepared,
            delegates,
            inputs,
            outputs,
            input_set,
            compute_pool,
            max_instructions: options.max_instructions,
            max_loop_iterations: options.max_loop_iterations,
            largest_dim,
            timeout: None,
            cancel: CancelHandle::default(),
            profile: None,
        })
    }

    /// The method's interface and memory needs.
    pub fn meta(&self) -> &MethodMeta {
        &self.meta
    }

    /// Number of inputs.
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Number of outputs.
    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    /// Sets input `index`. Tensors must have the declared dtype, rank and dim order, and
    /// sizes the declaration allows; their data is copied in. Scalar inputs must equal
    /// the value the program was exported with, as upstream requires.
    pub fn set_input(&mut self, index: usize, value: &EValue) -> Result<()> {
        let id = *self.inputs.get(index).ok_or_else(|| {
            RuntimeError::invalid_argument(format!(
                "input {index} does not exist: the method has {} inputs",
                self.inputs.len()
            ))
        })?;
        let err = |m: String| RuntimeError::invalid_argument(format!("input {index}: {m}"));
        let slot = self
            .values
            .get_mut(id as usize)
            .ok_or_else(|| err("no such value".into()))?;
        match (slot, value) {
            (Slot::Tensor(t), EValue::Tensor(x)) => {
                if t.info.dtype != x.dtype() {
                    return Err(err(format!("expected {}, got {}", t.info.dtype, x.dtype())));
                }
                if t.info.sizes.len() != x.sizes().len() {
                    return Err(err(format!(
                        "expected rank {} (shape {:?}), got rank {} (shape {:?})",
                        t.info.sizes.len(),
                        t.info.sizes.as_slice(),
                        x.sizes().len(),
                        x.sizes()
                    )));
                }
                if t.info.dim_order.as_slice() != x.dim_order() {
                    return Err(err(format!(
                        "expected dim order {:?}, got {:?}",
                        t.info.dim_order.as_slice(),
                        x.dim_order()
                    )));
                }
                resize_slot(t, x.sizes()).map_err(|e| err(e.to_string()))?;
                if matches!(
                    t.storage,
                    Storage::Program { .. } | Storage::External { .. } | Storage::Folded { .. }
                ) {
                    return Err(err("the input is a constant of the program".into()));
                }
                if t.storage == Storage::Null {
                    t.storage = Storage::Heap { owner: id };
                }
                let dst = self
                    .memory
                    .write(t.access())
                    .map_err(|e| err(e.to_string()))?;
                if dst.len() != x.as_bytes().len() {
                    return Err(err(format!(
                        "{} bytes of data for {} bytes of tensor",
                        x.as_bytes().len(),
                        dst.len()
                    )));
                }
                dst.copy_from_slice(x.as_bytes());
            }
            (Slot::Int(a), EValue::Int(b)) if a == b => {}
            (Slot::Bool(a), EValue::Bool(b)) if a == b => {}
            (Slot::Double(a), EValue::Double(b))
                if (a.is_nan() && b.is_nan())
                    || (*a - *b).abs() <= 1e-4 + 1e-5 * b.abs()
                    || a == b => {}
            (Slot::String(a), EValue::String(b)) if **a == **b => {}
            (Slot::None, EValue::None) => {}
            (slot @ (Slot::Int(_) | Slot::Bool(_) | Slot::Double(_) | Slot::String(_)), v)
                if slot.kind() == v.kind() =>
            {
                return Err(err(format!(
                    "the program was exported with the constant {slot:?} here; got {v:?}"
                )))
            }
            (slot, v) => return Err(err(format!("expected {}, got {}", slot.kind(), v.kind()))),
        }
        if let Some(set) = self.input_set.get_mut(index) {
            *set = true;
        }
        Ok(())
    }

    /// Sets every input, in order.
    pub fn set_inputs(&mut self, values: &[EValue]) -> Result<()> {
        if values.len() != self.inputs.len() {
            return Err(RuntimeError::invalid_argument(format!(
                "the method takes {} inputs, got {}",
                self.inputs.len(),
                values.len()
            )));
        }
        values
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| self.set_input(i, v))
    }

    /// Bounds every later execution in time: one that runs longer stops with
    /// [`RuntimeError::DeadlineExceeded`] before its next instruction (`None`: no bound).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// Turns the recording of time per instruction on (clearing what was recorded) or
    /// off; see [`Method::profile`].
    pub fn set_profiling(&mut self, on: bool) {
        for (_, delegate) in &mut self.delegates {
            delegate.set_profiling(on);
        }
        for kernel in self.kernels.iter_mut().flatten() {
            kernel.set_profiling(on);
        }
        self.profile = on.then(|| {
            self.chains
                .iter()
                .map(|c| vec![(0, Duration::ZERO); c.len()])
                .collect()
        });
    }

    /// Time per operator and delegate over the executions since profiling was turned on,
    /// most expensive first. Moves, jumps and frees are left out.
    pub fn profile(&self) -> Vec<ProfileEntry> {
        let mut entries: Vec<ProfileEntry> = Vec::new();
        let Some(profile) = &self.profile else {
            return entries;
        };
        for (chain, times) in self.chains.iter().zip(profile) {
            for (instr, &(calls, total)) in chain.iter().zip(times) {
                // A kernel's parts (a fused region's steps, say) with each of its
                // calls; a delegate's once, below, however many calls run it.
                let mut parts = Vec::new();
                let (name, delegate) = match instr {
                    Instr::Kernel { op, kernel, .. } => {
                        if let Some(k) = self.kernels.get(*kernel as usize).and_then(Option::as_ref)
                        {
                            parts = k.profile();
                        }
                        let name = self.op_names.get(*op as usize).map_or("?", String::as_str);
                        (name.to_owned(), false)
                    }
                    Instr::Delegate { delegate, .. } => (
                        delegate_entry_name(
                            self.delegates
                                .get(*delegate as usize)
                                .map_or("?", |d| d.0.as_str()),
                        ),
                        true,
                    ),
                    _ => continue,
                };
                match entries.iter_mut().find(|e| e.name == name) {
                    Some(e) => {
                        e.calls += calls;
                        e.total += total;
                        for part in parts {
                            part.add_to(&mut e.parts);
                        }
                    }
                    None => entries.push(ProfileEntry {
                        name,
                        delegate,
                        calls,
                        total,
                        parts,
                    }),
                }
            }
        }
        // Each delegate's parts once, however many instructions call it.
        for (id, prepared) in &self.delegates {
            let name = delegate_entry_name(id);
            let Some(entry) = entries.iter_mut().find(|e| e.name == name) else {
                continue;
            };
            for part in prepared.profile() {
                part.add_to(&mut entry.parts);
            }
        }
        for entry in &mut entries {
            entry.parts.sort_by_key(|p| std::cmp::Reverse(p.total));
        }
        entries.retain(|e| e.calls > 0);
        entries.sort_by_key(|e| std::cmp::Reverse(e.total));
        entries
    }

    /// A handle that stops this method's execution from another thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Bytes the method holds allocated now, and its memory limit.
    pub fn memory_used(&self) -> (u64, u64) {
        (self.memory.budget.used(), self.memory.budget.limit())
    }

    /// Runs the method once.
    pub fn execute(&mut self) -> Result<()> {
        if let Some(i) = self.input_set.iter().position(|s| !s) {
            return Err(RuntimeError::InputNotSet(i));
        }
        let limits = Limits {
            instructions: self.max_instructions,
            loop_iterations: self.max_loop_iterations.unwrap_or_else(|| {
                let inputs =
                    self.inputs
                        .iter()
                        .filter_map(|&i| match self.values.get(i as usize) {
                            Some(Slot::Tensor(t)) => t.info.sizes.iter().max().copied(),
                            _ => None,
                        });
                let largest = inputs.fold(self.largest_dim, usize::max) as u64;
                largest.max(MIN_LOOP_ITERATIONS)
            }),
            deadline: self.timeout.map(|t| (Instant::now() + t, t)),
        };
        self.run(&limits)
    }

    fn run(&mut self, limits: &Limits) -> Result<()> {
        let Method {
            values,
            memory,
            chains,
            call_args,
            op_names,
            kernels,
            delegates,
            cancel,
            profile,
            compute_pool,
            ..
        } = self;
        let compute_pool: &ThreadPool = compute_pool;
        // The workers stay awake between the execution's parallel calls.
        let _held = compute_pool.hold();
        let mut executed = 0u64;
        let mut jumps_back = 0u64;
        for (c, chain) in chains.iter().enumerate() {
            let mut pc = 0;
            while let Some(instr) = chain.get(pc) {
                executed += 1;
                if executed > limits.instructions {
                    return Err(RuntimeError::InstructionLimit(limits.instructions));
                }
                if cancel.take() {
                    return Err(RuntimeError::Cancelled);
                }
                if let Some((deadline, timeout)) = limits.deadline {
                    if Instant::now() > deadline {
                        return Err(RuntimeError::DeadlineExceeded(timeout));
                    }
                }
                let started = profile.is_some().then(Instant::now);
                let at_pc = pc;
                let at = |source| (c, pc, source);
                let args_of = |r: &Range<u32>| {
                    call_args
                        .get(r.start as usize..r.end as usize)
                        .unwrap_or_default()
                };
                pc = match instr {
                    Instr::Nop => pc + 1,
                    Instr::Kernel { kernel, op, args } => {
                        let op = op_names.get(*op as usize).map_or("?", String::as_str);
                        let mut a = Args {
                            op,
                            ids: args_of(args),
                            values,
                            memory,
                            pool: compute_pool,
                            staging: &crate::args::PASSING,
                            derived: None,
                        };
                        let result =
                            match kernels.get_mut(*kernel as usize).and_then(Option::as_mut) {
                                Some(k) => k.run(&mut a),
                                None => Err(KernelError::Failed("no prepared kernel".into())),
                            };
                        result.map_err(|source| RuntimeError::Kernel {
                            op: op.to_owned(),
                            chain: c,
                            instruction: pc,
                            source,
                        })?;
                        pc + 1
                    }
                    Instr::Delegate { delegate, args } => {
                        let Some((id, handle)) = delegates.get_mut(*delegate as usize) else {
                            return Err(bad(format!("chain {c} instruction {pc}: no delegate")));
                        };
                        let mut a = Args {
                            op: id,
                            ids: args_of(args),
                            values,
                            memory,
                            pool: compute_pool,
                            staging: &crate::args::PASSING,
                            derived: None,
                        };
                        handle
                            .run(&mut a)
                            .map_err(|source| RuntimeError::Delegate {
                                index: *delegate as usize,
                                backend: id.clone(),
                                chain: c,
                                instruction: pc,
                                source,
                            })?;
                        pc + 1
                    }
                    Instr::Move { from, to } => {
                        let moved = values.get(*from as usize).cloned();
                        if let (Some(v), Some(slot)) = (moved, values.get_mut(*to as usize)) {
                            *slot = v;
                        }
                        pc + 1
                    }
                    Instr::JumpFalse { cond, destination } => {
                        let holds = match values.get(*cond as usize) {
                            Some(v) => condition(v, memory),
                            None => Err(KernelError::invalid("no such value")),
                        }
                        .map_err(|e| bad(format!("chain {c} instruction {pc}: {e}")))?;
                        if holds {
                            pc + 1
                        } else {
                            if *destination <= pc {
                                jumps_back += 1;
                                if jumps_back > limits.loop_iterations {
                                    let (chain, instruction, limit) = at(limits.loop_iterations);
                                    return Err(RuntimeError::LoopLimit {
                                        chain,
                                        instruction,
                                        limit,
                                    });
                                }
                            }
                            *destination
                        }
                    }
                    Instr::Free { value } => {
                        free(values, memory, *value)
                            .map_err(|e| bad(format!("chain {c} instruction {pc}: {e}")))?;
                        pc + 1
                    }
                };
                if let Some(started) = started {
                    let slot = profile
                        .as_mut()
                        .and_then(|p| p.get_mut(c))
                        .and_then(|p| p.get_mut(at_pc));
                    if let Some((calls, total)) = slot {
                        *calls += 1;
                        *total += started.elapsed();
                    }
                }
            }
        }
        Ok(())
    }

    /// Output `index`, copied out of the method's memory.
    pub fn output(&self, index: usize) -> Result<EValue> {
        let id = *self.outputs.get(index).ok_or_else(|| {
            RuntimeError::invalid_argument(format!(
                "output {index} does not exist: the method has {} outputs",
                self.outputs.len()
            ))
        })?;
        self.evalue(id as usize)
    }

    /// All outputs, copied out of the method's memory.
    pub fn outputs(&self) -> Result<Vec<EValue>> {
        (0..self.outputs.len()).map(|i| self.output(i)).collect()
    }

    fn tensor(&self, t: &TensorSlot) -> Result<Tensor> {
        let bytes = self
            .memory
            .read(Access {
                storage: t.storage,
                nbytes: t.nbytes(),
            })
            .map_err(|e| RuntimeError::invalid_argument(e.to_string()))?;
        Tensor::from_bytes(t.info.dtype, &t.info.sizes, &t.info.dim_order, bytes)
    }

    fn slot(&self, id: usize) -> Result<&Slot> {
        self.values
            .get(id)
            .ok_or_else(|| bad(format!("value {id} does not exist")))
    }

    fn evalue(&self, id: usize) -> Result<EValue> {
        let tensor_at = |i: u32| match self.slot(i as usize)? {
            Slot::Tensor(t) => self.tensor(t),
            other => Err(bad(format!("list element {i} is a {}", other.kind()))),
        };
        Ok(match self.slot(id)? {
            Slot::None => EValue::None,
            Slot::Int(v) => EValue::Int(*v),
            Slot::Double(v) => EValue::Double(*v),
            Slot::Bool(v) => EValue::Bool(*v),
            Slot::String(s) => EValue::String(s.to_string()),
            Slot::Tensor(t) => EValue::Tensor(self.tensor(t)?),
            Slot::IntList(items) => EValue::IntList(
                items
                    .iter()
                    .map(|&i| match self.slot(i as usize)? {
                        Slot::Int(v) => Ok(*v),
                        other => Err(bad(format!("int list element is a {}", other.kind()))),
                    })
                    .collect::<Result<_>>()?,
            ),
            Slot::DoubleList(v) => EValue::DoubleList(v.to_vec()),
            Slot::BoolList(v) => EValue::BoolList(v.to_vec()),
            Slot::TensorList(items) => {
                EValue::TensorList(items.iter().map(|&i| tensor_at(i)).collect::<Result<_>>()?)
            }
            Slot::OptionalTensorList(items) => EValue::OptionalTensorList(
                items
                    .iter()
                    .map(|i| i.map(tensor_at).transpose())
                    .collect::<Result<_>>()?,
            ),
        })
    }

    /// Names of the operators the method calls.
    pub fn operator_names(&self) -> &[String] {
        &self.op_names
    }
}

/// Which kernel call sites no instruction runs any more (folded at load, or fused into
/// another call).
fn chains_calls_unused(chains: &[Vec<Instr>], calls: usize) -> Vec<bool> {
    let mut unused = vec![true; calls];
    for instr in chains.iter().flatten() {
        if let Instr::Kernel { kernel, .. } = instr {
            if let Some(u) = unused.get_mut(*kernel as usize) {
                *u = false;
            }
        }
    }
    unused
}

/// What bounds one execution.
struct Limits {
    instructions: u64,
    loop_iterations: u64,
    deadline: Option<(Instant, Duration)>,
}

/// A `FreeCall`: a tensor not memory-planned gives its buffer back (it is reallocated if
/// written again); a planned tensor keeps its planned storage, so that the sharing the
/// memory plan set up holds and the outputs do not change.
fn free(values: &mut [Slot], memory: &mut Memory, value: u32) -> std::result::Result<(), String> {
    match values.get_mut(value as usize) {
        Some(Slot::Tensor(t)) => {
            match t.storage {
                Storage::Heap { owner } => memory.release_heap(owner),
                Storage::Program { .. } | Storage::External { .. } | Storage::Folded { .. } => {
                    t.storage = Storage::Null
                }
                Storage::Planned { .. } | Storage::Null => {}
            }
            Ok(())
        }
        Some(other) => Err(format!("cannot free a {}", other.kind())),
        None => Err(format!("value {value} does not exist")),
    }
}

/// A JumpFalse condition: a Bool, or a bool tensor that is true when all elements are.
fn condition(v: &Slot, memory: &Memory) -> std::result::Result<bool, KernelError> {
    match v {
        Slot::Bool(b) => Ok(*b),
        Slot::Tensor(t) if t.info.dtype == DType::Bool => Ok(memory
            .read(Access {
                storage: t.storage,
                nbytes: t.nbytes(),
            })?
            .iter()
            .all(|&b| b != 0)),
        other => Err(KernelError::invalid(format!(
            "a jump condition must be a Bool or a bool tensor, not {}",
            match other {
                Slot::Tensor(t) => format!("a {} tensor", t.info.dtype),
                o => o.kind().to_owned(),
            }
        ))),
    }
}

fn parse_values(
    pte: &Pte<'_>,
    plan: et::ExecutionPlanRef<'_>,
    ptds: &[Ptd<'_>],
    program: &Program,
    memory: &mut Memory,
) -> Result<Vec<Slot>> {
    let refs = plan.values()?.ok_or_else(|| bad("method has no values"))?;
    let n = refs.len();
    let mut values: Vec<Slot> = Vec::with_capacity(n);
    for (i, v) in refs.iter().enumerate() {
        let what = format!("value {i}");
        use et::KernelTypesRef as K;
        let index = |x: i64| value_index(x, n, || what.clone());
        let slot = match v?.val()? {
            None => return Err(bad(format!("{what} has no contents"))),
            Some(K::Null(_)) => Slot::None,
            Some(K::Int(x)) => Slot::Int(x.int_val()?),
            Some(K::Double(x)) => Slot::Double(x.double_val()?),
            Some(K::Bool(x)) => Slot::Bool(x.bool_val()?),
            Some(K::String(s)) => Slot::String(s.string_val()?.unwrap_or_default().into()),
            Some(K::IntList(l)) => Slot::IntList(
                l.items()?
                    .into_iter()
                    .flatten()
                    .map(index)
                    .collect::<Result<_>>()?,
            ),
            Some(K::DoubleList(l)) => Slot::DoubleList(l.items()?.into_iter().flatten().collect()),
            Some(K::BoolList(l)) => Slot::BoolList(l.items()?.into_iter().flatten().collect()),
            Some(K::TensorList(l)) => Slot::TensorList(
                l.items()?
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        let j = index(x.into())?;
                        // Elements must be tensors parsed before the list, as upstream requires.
                        match values.get(j as usize) {
                            Some(Slot::Tensor(_)) => Ok(j),
                            _ => Err(bad(format!(
                                "{what}: tensor list element {x} is not an earlier tensor value"
                            ))),
                        }
                    })
                    .collect::<Result<_>>()?,
            ),
            Some(K::OptionalTensorList(l)) => Slot::OptionalTensorList(
                l.items()?
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        if x == -1 {
                            return Ok(None);
                        }
                        let j = index(x.into())?;
                        match values.get(j as usize) {
                            Some(Slot::Tensor(_) | Slot::None) => Ok(Some(j)),
                            _ => Err(bad(format!(
                                "{what}: optional tensor list element {x} is not an earlier tensor"
                            ))),
                        }
                    })
                    .collect::<Result<_>>()?,
            ),
            Some(K::Tensor(t)) => Slot::Tensor(parse_tensor(t, &what, pte, ptds, program, memory)?),
        };
        values.push(slot);
    }
    // Int lists name their elements by value index, later values included: each element
    // must be an Int (as upstream reads them), which also keeps lists from nesting.
    for (i, slot) in values.iter().enumerate() {
        if let Slot::IntList(items) = slot {
            if let Some(&x) = items
                .iter()
                .find(|&&x| !matches!(values.get(x as usize), Some(Slot::Int(_))))
            {
                return Err(bad(format!(
                    "value {i}: int list element {x} is not an Int value"
                )));
            }
        }
    }
    Ok(values)
}

fn parse_tensor(
    t: et::TensorRef<'_>,
    what: &str,
    pte: &Pte<'_>,
    ptds: &[Ptd<'_>],
    program: &Program,
    memory: &mut Memory,
) -> Result<TensorSlot> {
    let shape = tensor_shape(t, what)?;
    let alloc = t.allocation_info()?;
    let buffer_idx = t.data_buffer_idx()? as usize;
    let external = match t.extra_tensor_info()? {
        Some(e) if e.location()? == et::TensorDataLocation::External => Some(
            e.fully_qualified_name()?
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad(format!("{what}: external tensor without a name")))?,
        ),
        _ => None,
    };

    let planned_at = |alloc: et::AllocationDetailsRef<'_>, memory: &Memory| -> Result<Access> {
        let id = alloc.memory_id()?;
        let buffer_len = id
            .checked_sub(1)
            .and_then(|b| Some((b, memory.planned_len(b)?)));
        let Some((buffer, len)) = buffer_len else {
            return Err(bad(format!(
                "{what}: memory id {id} does not name one of the planned buffers"
            )));
        };
        let offset =
            u64::from(alloc.memory_offset_low()?) | (u64::from(alloc.memory_offset_high()?) << 32);
        let end = offset.checked_add(shape.nbytes as u64);
        if end.is_none_or(|e| e > len as u64) {
            return Err(bad(format!(
                "{what}: {} bytes at offset {offset} lie past the end of planned buffer {id} ({len} bytes)",
                shape.nbytes
            )));
        }
        Ok(Access {
            storage: Storage::Planned {
                buffer,
                offset: offset as usize,
            },
            nbytes: shape.nbytes,
        })
    };

    let find_external = |name: &str| -> Result<(u32, &[u8])> {
        if ptds.is_empty() {
            return Err(RuntimeError::ExternalData(format!(
                "{what} ({name:?}) is stored outside the program; provide the .ptd file that holds it"
            )));
        }
        for (f, ptd) in ptds.iter().enumerate() {
            let Some(entry) = ptd.get(name)? else {
                continue;
            };
            let layout = entry.layout.as_ref().ok_or_else(|| {
                RuntimeError::ExternalData(format!("{name:?} in data file {f} is not a tensor"))
            })?;
            let sizes: Vec<usize> = shape.sizes.to_vec();
            let ok = DType::from_scalar_type(layout.scalar_type) == shape.dtype
                && layout
                    .sizes
                    .iter()
                    .map(|&s| s as usize)
                    .eq(sizes.iter().copied())
                && layout
                    .dim_order
                    .iter()
                    .map(|&d| usize::from(d))
                    .eq(shape.dim_order.iter().copied());
            if !ok {
                return Err(RuntimeError::ExternalData(format!(
                    "{name:?}: the data file holds {}{:?} (dim order {:?}), the program expects {}{:?} (dim order {:?})",
                    DType::from_scalar_type(layout.scalar_type),
                    layout.sizes,
                    layout.dim_order,
                    shape.dtype,
                    sizes,
                    shape.dim_order.as_slice()
                )));
            }
            let data = entry.data.get(..shape.nbytes).ok_or_else(|| {
                RuntimeError::ExternalData(format!(
                    "{name:?} in data file {f} holds fewer than {} bytes",
                    shape.nbytes
                ))
            })?;
            return Ok((f as u32, data));
        }
        Err(RuntimeError::ExternalData(format!(
            "{what} ({name:?}) is in none of the {} data file(s) given",
            ptds.len()
        )))
    };

    let storage = match (external, alloc, buffer_idx) {
        (Some(name), None, _) => {
            let (f, bytes) = find_external(name)?;
            let file = program.data.get(f as usize).map_or(&[][..], |d| &***d);
            Storage::External {
                file: f,
                offset: offset_in(file, bytes)?,
            }
        }
        (Some(name), Some(a), _) => {
            let access = planned_at(a, memory)?;
            let (_, bytes) = find_external(name)?;
            write_planned(memory, access, bytes, what)?;
            access.storage
        }
        (None, None, 0) => Storage::Null,
        (None, None, idx) => {
            let Some(constants) = pte.constant_segment()? else {
                return Err(RuntimeError::NotSupported(format!(
                    "{what}: constants in the deprecated inline constant_buffer (upstream rejects \
                     these too); `pte repack` moves them into a constant segment"
                )));
            };
            if idx >= constants.len() {
                return Err(bad(format!(
                    "{what}: constant index {idx} is out of range (0..{})",
                    constants.len()
                )));
            }
            let bytes = constants.get(idx, shape.nbytes)?;
            Storage::Program {
                offset: offset_in(&program.bytes, bytes)?,
            }
        }
        (None, Some(a), 0) => planned_at(a, memory)?.storage,
        (None, Some(a), idx) => {
            let access = planned_at(a, memory)?;
            let init = pte.mutable_data(0)?.ok_or_else(|| {
                bad(format!(
                    "{what}: initial state in a missing mutable data segment"
                ))
            })?;
            let bytes = init.get(idx, shape.nbytes)?;
            write_planned(memory, access, bytes, what)?;
            access.storage
        }
    };
    Ok(TensorSlot {
        info: TensorInfo {
            dtype: shape.dtype,
            sizes: shape.sizes,
            dim_order: shape.dim_order,
        },
        capacity: shape.numel,
        dynamism: shape.dynamism,
        storage,
    })
}

/// Copies a tensor's initial bytes into its planned place.
fn write_planned(memory: &mut Memory, at: Access, bytes: &[u8], what: &str) -> Result<()> {
    let dst = memory.write(at).map_err(|e| bad(format!("{what}: {e}")))?;
    if dst.len() != bytes.len() {
        return Err(bad(format!(
            "{what}: {} bytes of initial data for {} bytes of tensor",
            bytes.len(),
            dst.len()
        )));
    }
    dst.copy_from_slice(bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn loaded_methods_can_move_to_other_threads() {
        fn send<T: Send>() {}
        send::<super::Method>();
        send::<crate::Program>();
    }
}
