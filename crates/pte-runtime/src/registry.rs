//! Kernel and backend registries: how operators and delegates are found by name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::error::KernelResult;

/// A kernel as registered: it prepares one runnable instance per call site when a method
/// loads. Preparing may read the call's constant arguments (weights) and keep derived
/// state, such as packed weights or a chosen algorithm.
pub trait Kernel: Send + Sync {
    /// Prepares the instance that will run this call site.
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>>;
}

/// One call site's kernel instance, run at each execution.
pub trait PreparedKernel: Send {
    /// Runs the call.
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult;

    /// Argument positions of constants this call captured when it was prepared (packed
    /// weights, say) and never reads again: a constant computed at load that no call
    /// reads any more gives its memory back.
    fn consumed(&self) -> &[usize] {
        &[]
    }

    /// Argument positions this call writes, when it knows them (a delegate: the
    /// positions of its outputs); `None`: it may write any argument. The runtime
    /// elides more copies around a call that names them.
    fn written(&self) -> Option<&[usize]> {
        None
    }

    /// Turns the timing of this call's parts on (clearing what was recorded) or off. A
    /// delegate that runs a graph times its nodes; a plain kernel has no parts.
    fn set_profiling(&mut self, _on: bool) {}

    /// Time per part over the runs since profiling was turned on, by part name.
    fn profile(&self) -> Vec<PartProfile> {
        Vec::new()
    }
}

/// Time spent in one kind of part of a prepared call (a delegate's node kind, say).
#[derive(Clone, Debug, PartialEq)]
pub struct PartProfile {
    /// What the part is, e.g. `Conv2d`.
    pub name: String,
    /// Times it ran.
    pub calls: u64,
    /// Time spent in it.
    pub total: Duration,
}

impl PartProfile {
    /// Adds this part to `parts`: to the entry of the same name, or as a new one.
    pub fn add_to(self, parts: &mut Vec<PartProfile>) {
        match parts.iter_mut().find(|p| p.name == self.name) {
            Some(p) => {
                p.calls += self.calls;
                p.total += self.total;
            }
            None => parts.push(self),
        }
    }
}

/// Runs and time of each step of a prepared call, kept while profiling is on: what a
/// kernel that runs steps of its own (a delegate's nodes, a fused region's layers)
/// needs for [`PreparedKernel::profile`]. Recording allocates nothing.
#[derive(Debug, Default)]
pub struct StepTimes(Option<Vec<(u64, Duration)>>);

impl StepTimes {
    /// Turns timing on for `steps` steps (clearing what was recorded) or off.
    pub fn set(&mut self, on: bool, steps: usize) {
        self.0 = on.then(|| vec![(0, Duration::ZERO); steps]);
    }

    /// The start of a step, when profiling is on.
    pub fn start(&self) -> Option<Instant> {
        self.0.is_some().then(Instant::now)
    }

    /// Ends step `step`, started at `started`.
    pub fn record(&mut self, step: usize, started: Option<Instant>) {
        if let (Some(started), Some((runs, total))) =
            (started, self.0.as_mut().and_then(|t| t.get_mut(step)))
        {
            *runs += 1;
            *total += started.elapsed();
        }
    }

    /// The steps that ran, merged by name (`name(step)`).
    pub fn parts(&self, mut name: impl FnMut(usize) -> String) -> Vec<PartProfile> {
        let mut parts = Vec::new();
        for (k, &(calls, total)) in self.0.iter().flatten().enumerate() {
            if calls > 0 {
                PartProfile {
                    name: name(k),
                    calls,
                    total,
                }
                .add_to(&mut parts);
            }
        }
        parts
    }
}

/// A stateless kernel: a plain function.
pub type KernelFn = fn(&mut Args<'_>) -> KernelResult;

#[derive(Clone, Copy)]
struct FnKernel(KernelFn);

impl Kernel for FnKernel {
    fn prepare(&self, _: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        Ok(Box::new(*self))
    }
}

impl PreparedKernel for FnKernel {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        (self.0)(args)
    }
}

/// Kernels by operator name (`namespace::name.overload`, or `namespace::name` for the
/// default overload).
#[derive(Clone, Default)]
pub struct KernelRegistry {
    kernels: BTreeMap<String, Arc<dyn Kernel>>,
    /// Operators whose kernels are pure: a deterministic function of their arguments,
    /// writing nothing but their outputs (see [`KernelRegistry::mark_pure`]).
    pure: BTreeSet<String>,
    /// Proposes fusions of consecutive calls when a method loads.
    fuser: Option<Arc<dyn crate::Fuser>>,
}

impl KernelRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) a kernel.
    pub fn register(&mut self, name: &str, kernel: impl Kernel + 'static) {
        self.kernels.insert(name.to_owned(), Arc::new(kernel));
    }

    /// Registers (or replaces) a stateless kernel function.
    pub fn register_fn(&mut self, name: &str, f: KernelFn) {
        self.register(name, FnKernel(f));
    }

    /// Declares the kernel of `name` pure: a deterministic function of its arguments that
    /// writes only its outputs (the arguments the calling convention makes outputs).
    /// Calls of pure kernels whose inputs are all constants run once, at load.
    pub fn mark_pure(&mut self, name: &str) {
        self.pure.insert(name.to_owned());
    }

    /// Whether the kernel of `name` was declared pure.
    pub fn is_pure(&self, name: &str) -> bool {
        self.pure.contains(name)
    }

    /// Sets the fuser that proposes, when a method loads, groups of calls to run as one
    /// (see [`crate::Fuser`]).
    pub fn set_fuser(&mut self, fuser: impl crate::Fuser + 'static) {
        self.fuser = Some(Arc::new(fuser));
    }

    /// The fuser, if one was set.
    pub fn fuser(&self) -> Option<&dyn crate::Fuser> {
        self.fuser.as_deref()
    }

    /// The kernel for an operator name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Kernel>> {
        self.kernels.get(name)
    }

    /// Registered operator names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kernels.keys().map(String::as_str)
    }
}

/// Data a backend can look up while initializing a delegate: the program's named data and
/// the `.ptd` files, by key (the `.ptd` files first, as upstream merges them).
pub trait NamedData {
    /// The bytes stored under `key`, if any; they may be kept without a copy.
    fn get(&self, key: &str) -> Option<crate::SharedBytes>;
}

/// One argument of a delegate call, as the method declares it when it loads.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgDecl {
    /// A tensor: dtype, sizes (for a dynamic one, the largest it may have) and dim order.
    Tensor {
        info: crate::TensorInfo,
        dynamism: crate::Dynamism,
    },
    /// Any other value, by kind (`Int`, `None`, ...).
    Other(&'static str),
}

/// A call of a delegate in the method's instructions.
#[derive(Clone, Debug, PartialEq)]
pub struct DelegateCall {
    /// Where the call is.
    pub chain: usize,
    pub instruction: usize,
    /// Its arguments (the delegate's inputs, then its outputs).
    pub args: Vec<ArgDecl>,
}

/// What a backend gets to initialize one delegate.
pub struct DelegateInit<'a> {
    /// Which delegate of the method this is (its index in the plan's delegate list).
    pub index: usize,
    /// The delegate's processed payload; it may be kept without a copy.
    pub processed: crate::SharedBytes,
    /// Compile specs as (key, value) pairs.
    pub compile_specs: &'a [(String, Vec<u8>)],
    /// Named data of the program and its data files.
    pub named_data: &'a dyn NamedData,
    /// The method's memory budget: what the delegate keeps (packed weights, working
    /// memory) is charged to it, see [`crate::Buffer`].
    pub budget: &'a crate::MemoryBudget,
    /// The method's thread pool; a backend may keep it for its executions.
    pub pool: &'a std::sync::Arc<pte_compute::ThreadPool>,
    /// Working memory shared by every delegate call of the method (they run one at a
    /// time); a backend sizes it at load and takes it for each execution.
    pub workspace: &'a crate::Workspace,
    /// State derived from constant bytes (packed weights), shared with the method's
    /// other delegates and kernels that read the same bytes.
    pub derived: &'a crate::DerivedStates,
    /// Every call of this delegate in the method, so that a backend can check the
    /// arguments against its payload once, at load.
    pub calls: &'a [DelegateCall],
}

/// A backend that runs delegated subgraphs (`BackendDelegate.id` names it).
pub trait Backend: Send + Sync {
    /// Prepares one delegate; called once per delegate when a method loads.
    fn init(&self, init: &DelegateInit<'_>) -> KernelResult<Box<dyn PreparedKernel>>;
}

/// Backends by id.
#[derive(Clone, Default)]
pub struct BackendRegistry {
    backends: BTreeMap<String, Arc<dyn Backend>>,
}

impl BackendRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) a backend.
    pub fn register(&mut self, id: &str, backend: impl Backend + 'static) {
        self.backends.insert(id.to_owned(), Arc::new(backend));
    }

    /// The backend for an id.
    pub fn get(&self, id: &str) -> Option<&Arc<dyn Backend>> {
        self.backends.get(id)
    }

    /// Registered backend ids, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.backends.keys().map(String::as_str)
    }
}
