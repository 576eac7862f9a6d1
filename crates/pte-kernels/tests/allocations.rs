//! Steady-state execution allocates nothing: after a first execution, running a method
//! again (inputs set, execute) makes no heap allocation.
//!
//! Every portable fixture of the manifest runs here on its recorded inputs (the first case
//! of each method; every case, in order, for sequential fixtures), with the fast paths
//! and fusions `pte run` uses. Each kernel, fused ones included, is wrapped so that
//! allocations are attributed to the operator during whose call they happened (the
//! runtime's `io` views included); what no kernel accounts for was allocated by the
//! runtime itself (`set_inputs`, the instruction loop).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pte_runtime::{npy, Args, EValue, Kernel, KernelRegistry, KernelResult, PreparedKernel};
use pte_runtime::{Alias, CallId, Fuser, Fusion, Graph};
use pte_runtime::{Method, Program};
use pte_testkit::Fixture;

#[global_allocator]
static COUNTING: pte_alloc::CountingAllocator = pte_alloc::CountingAllocator;

fn allocations() -> usize {
    pte_alloc::allocations() as usize
}

/// Allocations counted per operator name, over all call sites of that operator.
type Tally = Arc<Mutex<BTreeMap<String, Arc<AtomicUsize>>>>;

/// A registered kernel whose call sites count the allocations made while they run.
struct Counted {
    name: String,
    inner: Arc<dyn Kernel>,
    tally: Tally,
}

impl Kernel for Counted {
    fn prepare(&self, args: &Args<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        let count = self
            .tally
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default()
            .clone();
        Ok(Box::new(CountedRun {
            inner: self.inner.prepare(args)?,
            count,
        }))
    }
}

struct CountedRun {
    inner: Box<dyn PreparedKernel>,
    count: Arc<AtomicUsize>,
}

impl PreparedKernel for CountedRun {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        let before = allocations();
        let result = self.inner.run(args);
        self.count
            .fetch_add(allocations() - before, Ordering::Relaxed);
        result
    }
}

/// The crate's fuser, its fused kernels wrapped to count into `tally` under the
/// fusion's name.
struct CountedFuser {
    kernels: Arc<KernelRegistry>,
    tally: Tally,
}

impl CountedFuser {
    fn inner(&self) -> &dyn Fuser {
        self.kernels
            .fuser()
            .expect("the crate's registry has a fuser")
    }
}

impl Fuser for CountedFuser {
    fn fuse(&self, graph: &Graph<'_>) -> Vec<Fusion> {
        let mut fusions = self.inner().fuse(graph);
        for f in &mut fusions {
            f.kernel = Arc::new(Counted {
                name: f.name.clone(),
                inner: f.kernel.clone(),
                tally: self.tally.clone(),
            });
        }
        fusions
    }

    fn aliases(&self, graph: &Graph<'_>) -> Vec<Alias> {
        self.inner().aliases(graph)
    }

    fn defer_folding(&self, graph: &Graph<'_>) -> Vec<CallId> {
        self.inner().defer_folding(graph)
    }
}

/// Every kernel of the crate and its fusions, wrapped to count into `tally`.
fn counted_registry(tally: &Tally) -> KernelRegistry {
    let kernels = Arc::new(pte_kernels::registry());
    let mut counted = KernelRegistry::new();
    for name in kernels.names() {
        let inner = kernels.get(name).expect("registered").clone();
        counted.register(
            name,
            Counted {
                name: name.to_owned(),
                inner,
                tally: tally.clone(),
            },
        );
        if kernels.is_pure(name) {
            counted.mark_pure(name);
        }
    }
    counted.set_fuser(CountedFuser {
        kernels: kernels.clone(),
        tally: tally.clone(),
    });
    counted
}

/// `(fixture, operator)` pairs known to allocate in steady state, each with a comment
/// saying why. Keep this empty if at all possible; an entry excuses only that operator in
/// that fixture.
const ALLOWED: &[(&str, &str)] = &[];

/// The inputs of each call a fixture makes, in order: every case of a sequential fixture
/// (state carries over), else the first case of each method.
fn calls(f: &Fixture, program: &Program) -> Vec<(String, Vec<EValue>)> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for case in &f.cases {
        if !f.sequential && seen.contains(&case.method) {
            continue;
        }
        seen.push(case.method.clone());
        let meta = program.method_meta(&case.method).unwrap();
        let inputs = case
            .inputs
            .iter()
            .zip(&meta.inputs)
            .map(|(path, m)| npy::read_input(f.path(path), m).unwrap())
            .collect();
        out.push((case.method.clone(), inputs));
    }
    out
}

/// Allocations of the second run of each call: (by the runtime, by operator).
fn measure(f: &Fixture) -> (usize, BTreeMap<String, usize>) {
    let mut program = Program::open(f.program_path()).unwrap();
    for d in f.data_paths() {
        program.add_data_file(d).unwrap();
    }
    let tally = Tally::default();
    let kernels = counted_registry(&tally);
    let calls = calls(f, &program);
    let mut methods: BTreeMap<String, Method> = BTreeMap::new();
    for (name, _) in &calls {
        if !methods.contains_key(name) {
            let m = program.load_method(name, &kernels).unwrap();
            methods.insert(name.clone(), m);
        }
    }
    let mut run = |method: &str, inputs: &[EValue]| {
        let m = methods.get_mut(method).unwrap();
        m.set_inputs(inputs)
            .unwrap_or_else(|e| panic!("{}: {e}", f.name));
        m.execute().unwrap_or_else(|e| panic!("{}: {e}", f.name));
    };
    // Warm up: every call once, so kernels and the runtime size their buffers.
    for (method, inputs) in &calls {
        run(method, inputs);
    }
    for count in tally.lock().unwrap().values() {
        count.store(0, Ordering::Relaxed);
    }
    let before = allocations();
    for (method, inputs) in &calls {
        run(method, inputs);
    }
    let total = allocations() - before;
    let by_op: BTreeMap<String, usize> = tally
        .lock()
        .unwrap()
        .iter()
        .map(|(op, n)| (op.clone(), n.load(Ordering::Relaxed)))
        .filter(|&(_, n)| n > 0)
        .collect();
    (total.saturating_sub(by_op.values().sum()), by_op)
}

#[test]
fn second_execution_allocates_nothing() {
    let manifest = pte_testkit::manifest();
    let mut failures = Vec::new();
    let mut measured = 0;
    for f in manifest.fixtures.iter().filter(|f| f.lowering != "xnnpack") {
        let (runtime, mut by_op) = measure(f);
        measured += 1;
        by_op.retain(|op, _| !ALLOWED.contains(&(f.name.as_str(), op.as_str())));
        if runtime > 0 || !by_op.is_empty() {
            let ops: Vec<String> = by_op.iter().map(|(op, n)| format!("{op} {n}")).collect();
            failures.push(format!(
                "{}: runtime {runtime}; kernels: {}",
                f.name,
                ops.join(", ")
            ));
        }
    }
    assert!(measured > 0, "no fixtures");
    eprintln!(
        "{measured} fixtures run a second time, {} of them allocating",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {measured} fixtures allocate in a second execution:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}
