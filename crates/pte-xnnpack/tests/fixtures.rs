//! Every XNNPACK-lowered fixture runs through the backend and matches upstream's
//! recorded outputs: floats within the fixture's tolerance, integer outputs exactly.
//! `PTE_FIXTURES=a,b` restricts the run to some fixtures. `PTE_XNNPACK_MODELS=DIR`
//! makes the XNNPACK fixture test run the large on-demand models instead
//! (`tools/gen_xnnpack_fixtures.py --models DIR`, not committed).

use pte_runtime::{npy, BackendRegistry, EValue, LoadOptions, Method, Program, Tensor};
use pte_testkit::Fixture;

fn backends() -> BackendRegistry {
    let mut b = BackendRegistry::new();
    pte_xnnpack::register(&mut b);
    b
}

fn compare(f: &Fixture, k: usize, got: &EValue, path: &str) -> Result<(), String> {
    let EValue::Tensor(got) = got else {
        return Err(format!("output {k} is a {}, not a tensor", got.kind()));
    };
    let got: Tensor = got.to_contiguous().map_err(|e| e.to_string())?;
    let want = npy::read_tensor(f.path(path)).map_err(|e| e.to_string())?;
    if got.dtype() != want.dtype() || got.sizes() != want.sizes() {
        return Err(format!(
            "output {k}: {} {:?}, upstream {} {:?}",
            got.dtype(),
            got.sizes(),
            want.dtype(),
            want.sizes()
        ));
    }
    let (a, b) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    if got.dtype().is_float() {
        if let Some((i, x, y)) = f.tolerance.first_mismatch(&a, &b) {
            return Err(format!(
                "output {k} element {i}: {x}, upstream {y} (rtol {}, atol {})",
                f.tolerance.rtol, f.tolerance.atol
            ));
        }
    } else if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        return Err(format!(
            "output {k} element {i}: {}, upstream {}",
            a[i], b[i]
        ));
    }
    Ok(())
}

fn run_fixture(f: &Fixture, threads: usize) -> Result<usize, String> {
    let mut program = Program::open(f.program_path()).map_err(|e| e.to_string())?;
    for d in f.data_paths() {
        program.add_data_file(d).map_err(|e| e.to_string())?;
    }
    let kernels = pte_kernels::registry();
    let backends = backends();
    let options = LoadOptions {
        threads: Some(threads),
        ..LoadOptions::default()
    };
    let mut methods: std::collections::BTreeMap<String, Method> = Default::default();
    for (n, case) in f.cases.iter().enumerate() {
        if !f.sequential || !methods.contains_key(&case.method) {
            let m = program
                .load_method_with(&case.method, &kernels, &backends, &options)
                .map_err(|e| e.to_string())?;
            methods.insert(case.method.clone(), m);
        }
        let method = methods.get_mut(&case.method).unwrap();
        let inputs: Vec<EValue> = (0..case.inputs.len())
            .map(|k| npy::read_input(f.path(&case.inputs[k]), &method.meta().inputs[k]).unwrap())
            .collect();
        method
            .set_inputs(&inputs)
            .map_err(|e| format!("case {n}: {e}"))?;
        method.execute().map_err(|e| format!("case {n}: {e}"))?;
        let outputs = method.outputs().map_err(|e| format!("case {n}: {e}"))?;
        if outputs.len() != case.outputs.len() {
            return Err(format!(
                "case {n}: {} outputs, upstream {}",
                outputs.len(),
                case.outputs.len()
            ));
        }
        for (k, (got, path)) in outputs.iter().zip(&case.outputs).enumerate() {
            compare(f, k, got, path).map_err(|e| format!("case {n}: {e}"))?;
        }
    }
    Ok(f.cases.len())
}

/// Runs every XNNPACK-lowered fixture of a manifest at 1 and 2 threads.
fn run_all(manifest: &pte_testkit::Manifest) {
    let only: Option<Vec<String>> = std::env::var("PTE_FIXTURES")
        .ok()
        .map(|s| s.split(',').map(str::to_owned).collect());
    let mut failures = Vec::new();
    let mut passed = 0;
    for f in manifest.fixtures.iter().filter(|f| f.lowering == "xnnpack") {
        if only.as_ref().is_some_and(|o| !o.contains(&f.name)) {
            continue;
        }
        for threads in [1, 2] {
            match run_fixture(f, threads) {
                Ok(_) => passed += 1,
                Err(e) => failures.push(format!("{} ({threads} threads): {e}", f.name)),
            }
        }
    }
    eprintln!("{passed} fixture runs passed, {} failed", failures.len());
    assert!(passed + failures.len() > 0, "no XNNPACK fixture ran");
    assert!(
        failures.is_empty(),
        "failing fixtures:\n  {}",
        failures.join("\n  ")
    );
}

/// The delegated programs among the general fixtures (`tests/fixtures`).
#[test]
fn general_fixtures_lowered_to_xnnpack_match_upstream() {
    run_all(&pte_testkit::manifest());
}

/// The XNNPACK fixtures (`tests/xnnpack`): float, fp16, quantized, .ptd, dynamic shapes;
/// or the on-demand models in `PTE_XNNPACK_MODELS`.
#[test]
fn xnnpack_fixtures_match_upstream() {
    // A relative directory is taken from the workspace root, where the generator ran.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::var_os("PTE_XNNPACK_MODELS")
        .map(|d| root.join(d))
        .unwrap_or_else(pte_testkit::xnnpack_dir);
    run_all(&pte_testkit::manifest_in(&dir));
}

/// Passes every delegate to the XNNPACK backend and keeps the workspace it was given.
struct Recording(std::sync::Mutex<Vec<pte_runtime::Workspace>>);

impl pte_runtime::Backend for &'static Recording {
    fn init(
        &self,
        init: &pte_runtime::DelegateInit<'_>,
    ) -> pte_runtime::KernelResult<Box<dyn pte_runtime::PreparedKernel>> {
        self.0.lock().unwrap().push(init.workspace.clone());
        pte_xnnpack::XnnpackBackend.init(init)
    }
}

/// The delegate calls of a method share one arena (they run one at a time): every
/// delegate sees the memory the others reserved, and the program still matches upstream.
#[test]
fn delegates_of_a_method_share_their_working_memory() {
    let manifest = pte_testkit::manifest_in(&pte_testkit::xnnpack_dir());
    let f = manifest
        .fixtures
        .iter()
        .find(|f| f.name == "xnn_transformer_block")
        .expect("the transformer block fixture");
    let recording: &'static Recording = Box::leak(Box::new(Recording(Default::default())));
    let mut backends = BackendRegistry::new();
    backends.register(pte_xnnpack::BACKEND_ID, recording);
    let program = Program::open(f.program_path()).unwrap();
    let case = &f.cases[0];
    let mut method = program
        .load_method_with(
            &case.method,
            &pte_kernels::registry(),
            &backends,
            &LoadOptions::default(),
        )
        .unwrap();
    let workspaces = recording.0.lock().unwrap().clone();
    assert!(workspaces.len() >= 3, "{} delegates", workspaces.len());
    let largest = workspaces[0].lock().arena.len();
    assert!(largest > 0);
    for w in &workspaces {
        assert_eq!(w.lock().arena.len(), largest);
    }
    workspaces[1].reserve(largest + 4096, 0).unwrap();
    assert_eq!(workspaces[2].lock().arena.len(), largest + 4096);
    let inputs: Vec<EValue> = (0..case.inputs.len())
        .map(|k| npy::read_input(f.path(&case.inputs[k]), &method.meta().inputs[k]).unwrap())
        .collect();
    method.set_inputs(&inputs).unwrap();
    method.execute().unwrap();
    let outputs = method.outputs().unwrap();
    for (k, (got, path)) in outputs.iter().zip(&case.outputs).enumerate() {
        compare(f, k, got, path).unwrap();
    }
}
