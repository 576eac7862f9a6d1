//! The operator conformance suite: every case of `tests/conformance/manifest.json` (written
//! by `tools/gen_conformance.py`) is its own test, named `family::case`, so the usual
//! filters work: `cargo test -p pte-kernels --test conformance -- conv`.
//!
//! A case runs one program on stored inputs and compares with eager PyTorch's outputs:
//! output kinds, dtypes and shapes exactly; integers and bools bit for bit; floats within
//! the case's tolerance (`|a - b| <= atol + rtol * |b|`, NaN matches NaN, infinities must
//! be equal, and signs of zeros too where the case says `signed_zeros`), complex numbers
//! part by part. Random operators
//! are checked by the statistics the manifest records. A case whose step says
//! `expect_error` passes when loading or running returns an error (a panic never passes).
//!
//! Ratchet: `tests/conformance/known_failures.txt` lists the cases that fail today. A listed
//! case that passes is a failure (remove it from the list), and so is an unlisted case that
//! fails. Environment:
//! - `PTE_CONFORMANCE_STRICT=1` reports listed cases' real errors instead of accepting them;
//! - `PTE_CONFORMANCE_WRITE_KNOWN=1` rewrites the list from this run's failures.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};
use pte_runtime::{npy, strides_for, DType, EValue, KernelRegistry, Program, Tensor, ValueMeta};
use serde::Deserialize;

/// `tests/conformance/`, or `PTE_CONFORMANCE_DIR` (a suite the generator wrote elsewhere
/// with `--out`, e.g. an exploratory sweep).
fn suite_dir() -> PathBuf {
    match std::env::var_os("PTE_CONFORMANCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance"),
    }
}

#[derive(Deserialize)]
struct Manifest {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    family: String,
    program: String,
    method: String,
    steps: Vec<Step>,
    tolerance: Tolerance,
    #[serde(default)]
    signed_zeros: bool,
}

#[derive(Deserialize)]
struct Step {
    inputs: Vec<Value>,
    #[serde(default)]
    outputs: Vec<Value>,
    /// PyTorch's error: pte must return an error too.
    expect_error: Option<String>,
}

#[derive(Deserialize)]
struct Tolerance {
    rtol: f64,
    atol: f64,
}

/// A stored value: a `.npy` file (bfloat16 stored as its bits, scalars as 0-d arrays), or
/// only a description for outputs whose values are random or unspecified.
#[derive(Deserialize)]
struct Value {
    kind: String,
    dtype: String,
    path: Option<String>,
    shape: Option<Vec<usize>>,
    random: Option<RandomCheck>,
}

/// Bounds a random output must satisfy (computed by the generator for the output's size).
#[derive(Deserialize)]
struct RandomCheck {
    range: Option<[f64; 2]>,
    mean: Option<[f64; 2]>,
    std: Option<[f64; 2]>,
    dropout: Option<Dropout>,
}

/// Dropout: kept elements equal the input times `scale`, dropped ones are zero, and the
/// kept fraction lies in bounds. With a mask output, the mask (0s and 1s) says which were
/// kept.
#[derive(Deserialize)]
struct Dropout {
    input: usize,
    mask_output: Option<usize>,
    scale: f64,
    kept_fraction: [f64; 2],
}

const DTYPES: [DType; 16] = [
    DType::U8,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::Bool,
    DType::BF16,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::C32,
    DType::C64,
    DType::C128,
];

fn dtype_named(name: &str) -> Result<DType, String> {
    DTYPES
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| format!("pte has no {name} dtype"))
}

/// A stored tensor in its logical (row-major) layout, with the manifest's dtype.
fn read_tensor(v: &Value) -> Result<Tensor, String> {
    let path = v.path.as_ref().ok_or("the value has no data file")?;
    let want = dtype_named(&v.dtype)?;
    let t = npy::read_tensor(suite_dir().join(path)).map_err(|e| e.to_string())?;
    if t.dtype() == want {
        return Ok(t);
    }
    // bfloat16 is stored as its bits (numpy has no bfloat16).
    Tensor::from_bytes(want, t.sizes(), t.dim_order(), t.as_bytes()).map_err(|e| e.to_string())
}

/// The same logical tensor laid out in `dim_order`.
fn with_dim_order(t: &Tensor, dim_order: &[usize]) -> Result<Tensor, String> {
    if t.dim_order() == dim_order {
        return Ok(t.clone());
    }
    let size = t.dtype().size();
    let strides = strides_for(t.sizes(), dim_order);
    let src = t.as_bytes();
    let mut dst = vec![0u8; src.len()];
    let mut index = vec![0usize; t.sizes().len()];
    for element in src.chunks_exact(size) {
        let at = index
            .iter()
            .zip(&strides)
            .map(|(i, s)| i * s)
            .sum::<usize>()
            * size;
        dst[at..at + size].copy_from_slice(element);
        for (i, &n) in index.iter_mut().zip(t.sizes()).rev() {
            *i += 1;
            if *i < n {
                break;
            }
            *i = 0;
        }
    }
    Tensor::from_bytes(t.dtype(), t.sizes(), dim_order, &dst).map_err(|e| e.to_string())
}

fn read_input(v: &Value, meta: &ValueMeta) -> Result<EValue, String> {
    match meta {
        ValueMeta::Tensor(m) => Ok(EValue::Tensor(with_dim_order(
            &read_tensor(v)?,
            &m.dim_order,
        )?)),
        _ => {
            let path = v.path.as_ref().ok_or("the value has no data file")?;
            npy::read_input(suite_dir().join(path), meta).map_err(|e| e.to_string())
        }
    }
}

fn kind_of(v: &EValue) -> &'static str {
    match v {
        EValue::Tensor(_) => "tensor",
        EValue::Int(_) => "int",
        EValue::Double(_) => "float",
        EValue::Bool(_) => "bool",
        other => other.kind(),
    }
}

/// An output as a logical tensor (scalars as 0-d int64, float64 or bool).
fn as_tensor(v: &EValue) -> Result<Tensor, String> {
    let t = match v {
        EValue::Tensor(t) => t.to_contiguous(),
        EValue::Int(i) => Tensor::from_slice::<i64>(&[], &[*i]),
        EValue::Double(d) => Tensor::from_slice::<f64>(&[], &[*d]),
        EValue::Bool(b) => Tensor::from_bools(&[], &[*b]),
        other => return Err(format!("unexpected {} output", other.kind())),
    };
    t.map_err(|e| e.to_string())
}

fn floats(t: &Tensor) -> Result<Vec<f64>, String> {
    t.to_f64_vec().map_err(|e| e.to_string())
}

fn compare_values(got: &Tensor, want: &Tensor, case: &Case) -> Result<(), String> {
    // Complex values compare as their real and imaginary parts, one after the other.
    if got.dtype().is_float() || got.dtype().is_complex() {
        let (a, b) = (floats(got)?, floats(want)?);
        let tol = &case.tolerance;
        let bad = a.iter().zip(&b).position(|(&x, &y)| {
            if x.is_nan() || y.is_nan() {
                !(x.is_nan() && y.is_nan())
            } else if x.is_infinite() || y.is_infinite() {
                x != y
            } else if case.signed_zeros && x == 0.0 && y == 0.0 {
                x.is_sign_negative() != y.is_sign_negative()
            } else {
                (x - y).abs() > tol.atol + tol.rtol * y.abs()
            }
        });
        return match bad {
            Some(i) => Err(format!(
                "element {i}: {:?}, expected {:?} (rtol {}, atol {})",
                a[i], b[i], tol.rtol, tol.atol
            )),
            None => Ok(()),
        };
    }
    let size = got.dtype().size();
    let (x, y) = (got.as_bytes(), want.as_bytes());
    match (0..got.numel()).find(|i| x[i * size..(i + 1) * size] != y[i * size..(i + 1) * size]) {
        Some(i) => {
            let (a, b) = (floats(got)?, floats(want)?);
            Err(format!("element {i}: {}, expected {}", a[i], b[i]))
        }
        None => Ok(()),
    }
}

fn check_random(
    check: &RandomCheck,
    k: usize,
    outputs: &[Tensor],
    inputs: &[EValue],
) -> Result<(), String> {
    let x = floats(&outputs[k])?;
    let n = x.len().max(1) as f64;
    let mean = x.iter().sum::<f64>() / n;
    let std = (x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n).sqrt();
    if let Some([lo, hi]) = check.range {
        if let Some(v) = x.iter().find(|&&v| !(lo..hi).contains(&v)) {
            return Err(format!("value {v} outside [{lo}, {hi})"));
        }
    }
    for (what, value, bounds) in [("mean", mean, check.mean), ("std", std, check.std)] {
        if let Some([lo, hi]) = bounds {
            if !(lo..=hi).contains(&value) {
                return Err(format!("{what} {value} outside [{lo}, {hi}]"));
            }
        }
    }
    if let Some(d) = &check.dropout {
        let input = match inputs.get(d.input) {
            Some(EValue::Tensor(t)) => floats(&t.to_contiguous().map_err(|e| e.to_string())?)?,
            _ => return Err(format!("dropout input {} is not a tensor", d.input)),
        };
        let mask: Vec<bool> = match d.mask_output {
            // The mask itself: 0s and 1s (its agreement with the values is checked with
            // the values output).
            Some(m) if m == k => {
                if let Some(v) = x.iter().find(|&&v| v != 0.0 && v != 1.0) {
                    return Err(format!("mask value {v} is neither 0 nor 1"));
                }
                x.iter().map(|&v| v != 0.0).collect()
            }
            Some(m) => {
                let mask = floats(outputs.get(m).ok_or("no mask output")?)?;
                if let Some(i) = (0..x.len()).find(|&i| mask[i] == 0.0 && x[i] != 0.0) {
                    return Err(format!(
                        "element {i} is dropped by the mask but is {}",
                        x[i]
                    ));
                }
                mask.iter().map(|&m| m != 0.0).collect()
            }
            None => x.iter().map(|&v| v != 0.0).collect(),
        };
        let values = d.mask_output != Some(k);
        for (i, (&v, &keep)) in x.iter().zip(&mask).enumerate().filter(|_| values) {
            let scaled = input[i] * d.scale;
            if keep && (v - scaled).abs() > 1e-6 * scaled.abs() {
                return Err(format!(
                    "kept element {i} is {v}, expected input * {} = {scaled}",
                    d.scale
                ));
            }
        }
        let kept = mask.iter().filter(|&&m| m).count() as f64 / n;
        let [lo, hi] = d.kept_fraction;
        if !(lo..=hi).contains(&kept) {
            return Err(format!("kept fraction {kept} outside [{lo}, {hi}]"));
        }
    }
    Ok(())
}

fn compare(case: &Case, step: &Step, inputs: &[EValue], got: &[EValue]) -> Result<(), String> {
    if got.len() != step.outputs.len() {
        return Err(format!(
            "{} outputs, expected {}",
            got.len(),
            step.outputs.len()
        ));
    }
    let tensors: Vec<Tensor> = got.iter().map(as_tensor).collect::<Result<_, _>>()?;
    for (k, (value, want)) in got.iter().zip(&step.outputs).enumerate() {
        let at = |e: String| format!("output {k}: {e}");
        if kind_of(value) != want.kind {
            return Err(at(format!(
                "a {}, expected a {}",
                kind_of(value),
                want.kind
            )));
        }
        let t = &tensors[k];
        if t.dtype().name() != want.dtype {
            return Err(at(format!("dtype {}, expected {}", t.dtype(), want.dtype)));
        }
        if want.path.is_none() {
            if let Some(shape) = &want.shape {
                if t.sizes() != shape.as_slice() {
                    return Err(at(format!("shape {:?}, expected {shape:?}", t.sizes())));
                }
            }
            if let Some(check) = &want.random {
                check_random(check, k, &tensors, inputs).map_err(at)?;
            }
            continue;
        }
        let expected = read_tensor(want).map_err(at)?;
        if t.sizes() != expected.sizes() {
            return Err(at(format!(
                "shape {:?}, expected {:?}",
                t.sizes(),
                expected.sizes()
            )));
        }
        compare_values(t, &expected, case).map_err(at)?;
    }
    Ok(())
}

fn run_case(case: &Case, kernels: &KernelRegistry) -> Result<(), String> {
    let program = Program::open(suite_dir().join(&case.program)).map_err(|e| e.to_string());
    let first_expects_error = case.steps.first().is_some_and(|s| s.expect_error.is_some());
    let method = program.and_then(|p| {
        p.load_method(&case.method, kernels)
            .map_err(|e| e.to_string())
    });
    let mut method = match (method, first_expects_error) {
        (Ok(m), _) => m,
        (Err(_), true) => return Ok(()),
        (Err(e), false) => return Err(e),
    };
    for (n, step) in case.steps.iter().enumerate() {
        let at = |e: String| {
            if case.steps.len() > 1 {
                format!("step {n}: {e}")
            } else {
                e
            }
        };
        let metas = method.meta().inputs.clone();
        if metas.len() != step.inputs.len() {
            return Err(at(format!(
                "the method takes {} inputs, the case has {}",
                metas.len(),
                step.inputs.len()
            )));
        }
        let inputs: Vec<EValue> = step
            .inputs
            .iter()
            .zip(&metas)
            .map(|(v, m)| read_input(v, m))
            .collect::<Result<_, _>>()
            .map_err(at)?;
        let result = method
            .set_inputs(&inputs)
            .and_then(|()| method.execute())
            .and_then(|()| method.outputs());
        match (result, &step.expect_error) {
            (Err(_), Some(_)) => {}
            (Ok(_), Some(e)) => {
                return Err(at(format!(
                    "returned outputs; PyTorch rejects the arguments ({e})"
                )))
            }
            (Err(e), None) => return Err(at(e.to_string())),
            (Ok(outputs), None) => compare(case, step, &inputs, &outputs).map_err(at)?,
        }
    }
    Ok(())
}

/// Runs a case, turning a panic into a failure.
fn run_guarded(case: &Case, kernels: &KernelRegistry) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| run_case(case, kernels))).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(format!("panicked: {msg}"))
    })
}

fn known_failures(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, reason) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            (name.to_owned(), reason.trim().to_owned())
        })
        .collect()
}

fn write_known_failures(path: &Path, failures: &BTreeMap<String, String>) {
    let mut text = String::from(
        "# Conformance cases that fail today, one per line: name, then a short reason.\n\
         # The harness fails when a listed case passes, so this list only shrinks.\n\
         # Regenerate: PTE_CONFORMANCE_WRITE_KNOWN=1 cargo test -p pte-kernels --test conformance\n",
    );
    for (name, reason) in failures {
        let line = reason.lines().next().unwrap_or_default();
        let short: String = line.chars().take(160).collect();
        text.push_str(&format!("{name}  {short}\n"));
    }
    std::fs::write(path, text).expect("writing known_failures.txt");
}

fn main() {
    let args = Arguments::from_args();
    let path = suite_dir().join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let manifest: Manifest =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad {}: {e}", path.display()));
    assert!(
        !manifest.cases.is_empty(),
        "{} has no cases: regenerate it with tools/gen_conformance.py",
        path.display()
    );
    let known_path = suite_dir().join("known_failures.txt");
    let known = known_failures(&known_path);
    let names: std::collections::BTreeSet<String> = manifest
        .cases
        .iter()
        .map(|c| format!("{}::{}", c.family, c.name))
        .collect();
    assert_eq!(
        names.len(),
        manifest.cases.len(),
        "case names must be unique"
    );
    let strict = std::env::var_os("PTE_CONFORMANCE_STRICT").is_some();
    let write = std::env::var_os("PTE_CONFORMANCE_WRITE_KNOWN").is_some();
    let mut known = known;
    let stale: Vec<String> = known
        .keys()
        .filter(|k| !names.contains(*k))
        .cloned()
        .collect();
    // Rewriting the list drops stale entries; otherwise they are an error.
    assert!(
        write || stale.is_empty(),
        "known_failures.txt names cases the manifest does not have: {stale:?}"
    );
    known.retain(|k, _| names.contains(k));

    let kernels = Arc::new(pte_kernels::registry());
    let known = Arc::new(known);
    let failures = Arc::new(Mutex::new(BTreeMap::new()));
    let ran = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let trials = manifest
        .cases
        .into_iter()
        .map(|case| {
            let name = format!("{}::{}", case.family, case.name);
            let (kernels, known) = (kernels.clone(), known.clone());
            let (failures, ran) = (failures.clone(), ran.clone());
            Trial::test(name.clone(), move || {
                let result = run_guarded(&case, &kernels);
                ran.lock().unwrap().insert(name.clone());
                if let Err(e) = &result {
                    failures.lock().unwrap().insert(name.clone(), e.clone());
                }
                match (result, known.contains_key(&name)) {
                    _ if write => Ok(()),
                    (Ok(()), true) => Err(Failed::from(
                        "passes now: remove it from tests/conformance/known_failures.txt",
                    )),
                    (Err(e), true) if strict => Err(Failed::from(e)),
                    (Err(_), true) | (Ok(()), false) => Ok(()),
                    (Err(e), false) => Err(Failed::from(e)),
                }
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if write {
        // Cases this run filtered out keep their entries.
        let ran = ran.lock().unwrap();
        let mut list: BTreeMap<String, String> = known
            .iter()
            .filter(|(k, _)| !ran.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        list.extend(failures.lock().unwrap().clone());
        write_known_failures(&known_path, &list);
        eprintln!("wrote {}", known_path.display());
    }
    conclusion.exit();
}
