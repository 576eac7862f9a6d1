//! Every reference fixture runs here and matches upstream's recorded outputs.
//!
//! Floats within the fixture's tolerance (see `pte_testkit::Tolerance`), integers and
//! bools exactly. `PTE_FIXTURES=a,b` restricts the run to some fixtures.

use pte_runtime::{npy, EValue, Method, Program, RuntimeError, Tensor, ValueMeta};
use pte_testkit::{Case, Fixture};

fn load_input(f: &Fixture, case: &Case, k: usize, meta: &ValueMeta) -> EValue {
    npy::read_input(f.path(&case.inputs[k]), meta).unwrap()
}

/// An output as upstream's recording stores it: tensors as arrays, scalar outputs as 0-d
/// arrays (int64, float64 or bool).
fn as_tensor(v: &EValue) -> Result<Tensor, String> {
    match v {
        EValue::Tensor(t) => Ok(t.clone()),
        EValue::Int(i) => Ok(Tensor::from_slice::<i64>(&[], &[*i]).unwrap()),
        EValue::Double(d) => Ok(Tensor::from_slice::<f64>(&[], &[*d]).unwrap()),
        EValue::Bool(b) => Ok(Tensor::from_bools(&[], &[*b]).unwrap()),
        other => Err(format!("unexpected {} output", other.kind())),
    }
}

/// The first element where two integer or bool tensors differ, compared exactly in their
/// own type.
fn exact_mismatch(a: &Tensor, b: &Tensor) -> Option<(usize, String, String)> {
    let size = a.dtype().size();
    let (x, y) = (a.as_bytes(), b.as_bytes());
    (0..a.numel())
        .find(|i| x[i * size..(i + 1) * size] != y[i * size..(i + 1) * size])
        .map(|i| {
            let show = |t: &Tensor| format!("{:?}", &t.as_bytes()[i * size..(i + 1) * size]);
            (i, show(a), show(b))
        })
}

/// Outputs must have upstream's kinds, dtypes and shapes exactly; floats match within the
/// fixture's tolerance, integers and bools bit for bit.
fn compare(f: &Fixture, case: &Case, outputs: &[EValue]) -> Result<(), String> {
    if outputs.len() != case.outputs.len() {
        return Err(format!(
            "{} outputs, upstream has {}",
            outputs.len(),
            case.outputs.len()
        ));
    }
    for (k, (got, path)) in outputs.iter().zip(&case.outputs).enumerate() {
        if let Some(kind) = case.output_kinds.get(k) {
            let ours = match got {
                EValue::Tensor(_) => "tensor",
                EValue::Int(_) => "int",
                EValue::Double(_) => "float",
                EValue::Bool(_) => "bool",
                other => other.kind(),
            };
            if ours != kind {
                return Err(format!("output {k}: a {ours}, upstream gave a {kind}"));
            }
        }
        let expected = npy::read_tensor(f.path(path)).unwrap();
        let got = as_tensor(got)?.to_contiguous().map_err(|e| e.to_string())?;
        if got.dtype() != expected.dtype() {
            return Err(format!(
                "output {k}: dtype {}, upstream {}",
                got.dtype(),
                expected.dtype()
            ));
        }
        if got.sizes() != expected.sizes() {
            return Err(format!(
                "output {k}: shape {:?}, upstream {:?}",
                got.sizes(),
                expected.sizes()
            ));
        }
        if got.dtype().is_float() {
            let (a, b) = (got.to_f64_vec().unwrap(), expected.to_f64_vec().unwrap());
            if let Some((i, x, y)) = f.tolerance.first_mismatch(&a, &b) {
                return Err(format!(
                    "output {k} element {i}: {x}, upstream {y} (rtol {}, atol {})",
                    f.tolerance.rtol, f.tolerance.atol
                ));
            }
        } else if let Some((i, x, y)) = exact_mismatch(&got, &expected) {
            return Err(format!("output {k} element {i}: bytes {x}, upstream {y}"));
        }
    }
    Ok(())
}

fn run_fixture(f: &Fixture) -> Result<usize, String> {
    let mut program = Program::open(f.program_path()).map_err(|e| e.to_string())?;
    for d in f.data_paths() {
        program.add_data_file(d).map_err(|e| e.to_string())?;
    }
    let kernels = pte_kernels::registry();
    let mut methods: std::collections::BTreeMap<String, Method> = Default::default();
    for (n, case) in f.cases.iter().enumerate() {
        if !methods.contains_key(&case.method) {
            let m = program
                .load_method(&case.method, &kernels)
                .map_err(|e| e.to_string())?;
            methods.insert(case.method.clone(), m);
        }
        let method = methods.get_mut(&case.method).unwrap();
        let inputs: Vec<EValue> = (0..case.inputs.len())
            .map(|k| load_input(f, case, k, &method.meta().inputs[k]))
            .collect();
        method
            .set_inputs(&inputs)
            .map_err(|e| format!("case {n}: {e}"))?;
        method.execute().map_err(|e| format!("case {n}: {e}"))?;
        let outputs = method.outputs().map_err(|e| format!("case {n}: {e}"))?;
        compare(f, case, &outputs).map_err(|e| format!("case {n}: {e}"))?;
    }
    Ok(f.cases.len())
}

#[test]
fn fixtures_match_upstream() {
    let manifest = pte_testkit::manifest();
    let only: Option<Vec<String>> = std::env::var("PTE_FIXTURES")
        .ok()
        .map(|s| s.split(',').map(str::to_owned).collect());
    let mut failures = Vec::new();
    let mut passed = 0;
    let mut cases = 0;
    for f in &manifest.fixtures {
        if only.as_ref().is_some_and(|o| !o.contains(&f.name)) {
            continue;
        }
        let result = run_fixture(f);
        if f.lowering == "xnnpack" {
            // The XNNPACK delegate is not implemented yet: loading must say so clearly.
            match result {
                Err(e) if e.contains("XnnpackBackend") => passed += 1,
                other => failures.push(format!(
                    "{}: expected a missing-backend error, got {other:?}",
                    f.name
                )),
            }
            continue;
        }
        match result {
            Ok(n) => {
                passed += 1;
                cases += n;
            }
            Err(e) => failures.push(format!("{}: {e}", f.name)),
        }
    }
    eprintln!(
        "{passed} fixtures passed ({cases} cases), {} failed",
        failures.len()
    );
    assert!(
        passed + failures.len() > 0,
        "no fixture ran: the manifest is empty or PTE_FIXTURES names none of its fixtures"
    );
    assert!(
        failures.is_empty(),
        "failing fixtures:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn missing_data_file_is_a_clear_error() {
    let manifest = pte_testkit::manifest();
    let f = manifest
        .fixtures
        .iter()
        .find(|f| f.expect_error_without_data)
        .expect("fixture");
    let program = Program::open(f.program_path()).unwrap();
    let err = program
        .load_method("forward", &pte_kernels::registry())
        .unwrap_err();
    assert!(matches!(err, RuntimeError::ExternalData(_)), "{err}");
    assert!(err.to_string().contains(".ptd"), "{err}");
}
