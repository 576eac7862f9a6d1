//! Every committed `.pt2` fixture (`tests/fixtures/pt2`, written by
//! `tools/gen_pt2_fixtures.py` with plain PyTorch) compiles, loads in pte's runtime and
//! gives eager PyTorch's recorded outputs: floats within the fixture's stated tolerance,
//! integers and bools exactly. `PTE_PT2_FIXTURES=a,b` restricts the run;
//! `PTE_PT2_DIR=DIR` runs the on-demand models (`gen_pt2_fixtures.py --models DIR`).
//!
//! `upstream_runs_the_compiled_programs` (ignored unless asked for) runs
//! `tools/check_pt2_upstream.py`: the same programs in upstream ExecuTorch 1.5.1.

use std::path::{Path, PathBuf};

use pte_compiler::{compile, CompileOptions, ConstantPlacement};
use pte_runtime::{npy, EValue, Program, Tensor};
use pte_testkit::{Fixture, Manifest};

fn dir() -> PathBuf {
    match std::env::var_os("PTE_PT2_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/pt2"),
    }
}

fn manifest() -> Manifest {
    let text = std::fs::read_to_string(dir().join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest")
}

fn selected(f: &Fixture) -> bool {
    match std::env::var("PTE_PT2_FIXTURES") {
        Ok(list) => list.split(',').any(|n| n == f.name),
        Err(_) => true,
    }
}

fn as_tensor(v: &EValue) -> Result<Tensor, String> {
    match v {
        EValue::Tensor(t) => Ok(t.clone()),
        EValue::Int(i) => Ok(Tensor::from_slice::<i64>(&[], &[*i]).map_err(|e| e.to_string())?),
        EValue::Double(d) => Ok(Tensor::from_slice::<f64>(&[], &[*d]).map_err(|e| e.to_string())?),
        other => Err(format!("unexpected {} output", other.kind())),
    }
}

fn compare(f: &Fixture, expected: &[String], got: &[EValue]) -> Result<(), String> {
    if got.len() != expected.len() {
        return Err(format!(
            "{} outputs, eager has {}",
            got.len(),
            expected.len()
        ));
    }
    for (k, (g, path)) in got.iter().zip(expected).enumerate() {
        let want = npy::read_tensor(dir().join(path)).map_err(|e| e.to_string())?;
        let g = as_tensor(g)?.to_contiguous().map_err(|e| e.to_string())?;
        if g.dtype() != want.dtype() || g.sizes() != want.sizes() {
            return Err(format!(
                "output {k}: {} {:?}, eager {} {:?}",
                g.dtype(),
                g.sizes(),
                want.dtype(),
                want.sizes()
            ));
        }
        if g.dtype().is_float() {
            let (a, b) = (g.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
            if let Some((i, x, y)) = f.tolerance.first_mismatch(&a, &b) {
                return Err(format!("output {k} element {i}: {x}, eager {y}"));
            }
        } else if g.as_bytes() != want.as_bytes() {
            return Err(format!("output {k}: differs from eager"));
        }
    }
    Ok(())
}

fn run(f: &Fixture, placement: ConstantPlacement) -> Result<(), String> {
    let archive = std::fs::read(dir().join(&f.program)).map_err(|e| e.to_string())?;
    let options = CompileOptions {
        constants: placement,
        ..Default::default()
    };
    let out = compile(&archive, &options).map_err(|e| e.to_string())?;
    let mut program = Program::from_bytes(&out.pte).map_err(|e| e.to_string())?;
    if let Some(ptd) = &out.ptd {
        program.add_data_bytes(ptd).map_err(|e| e.to_string())?;
    }
    let kernels = pte_kernels::registry();
    let mut methods = std::collections::BTreeMap::new();
    for (n, case) in f.cases.iter().enumerate() {
        if !methods.contains_key(&case.method) {
            let m = program
                .load_method(&case.method, &kernels)
                .map_err(|e| e.to_string())?;
            methods.insert(case.method.clone(), m);
        }
        let method = methods.get_mut(&case.method).unwrap();
        let inputs: Vec<EValue> = case
            .inputs
            .iter()
            .enumerate()
            .map(|(k, p)| npy::read_input(dir().join(p), &method.meta().inputs[k]))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        method
            .set_inputs(&inputs)
            .map_err(|e| format!("case {n}: {e}"))?;
        method.execute().map_err(|e| format!("case {n}: {e}"))?;
        let outputs = method.outputs().map_err(|e| format!("case {n}: {e}"))?;
        compare(f, &case.outputs, &outputs).map_err(|e| format!("case {n}: {e}"))?;
        if !f.sequential {
            // A fresh method per case unless state must carry over.
            methods.remove(&case.method);
        }
    }
    Ok(())
}

fn run_all(placement: ConstantPlacement) {
    let mut failures = Vec::new();
    let mut passed = 0;
    for f in manifest().fixtures.iter().filter(|f| selected(f)) {
        match run(f, placement) {
            Ok(()) => passed += 1,
            Err(e) => failures.push(format!("{}: {e}", f.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} passed, failures:\n{}",
        passed,
        failures.join("\n")
    );
    assert!(passed > 0, "no fixture ran");
}

#[test]
fn compiled_fixtures_match_eager_pytorch() {
    run_all(ConstantPlacement::Program);
}

#[test]
fn compiled_fixtures_with_external_constants_match_eager_pytorch() {
    run_all(ConstantPlacement::External);
}

#[test]
#[ignore = "needs the reference environment (.venv-ref); run with --ignored"]
fn upstream_runs_the_compiled_programs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv-ref/bin/python");
    assert!(python.exists(), "no .venv-ref in {}", root.display());
    let status = std::process::Command::new(python)
        .arg(root.join("tools/check_pt2_upstream.py"))
        .arg("--dir")
        .arg(dir())
        .status()
        .expect("running tools/check_pt2_upstream.py");
    assert!(status.success());
}
