//! `pte run`: load a program, set inputs, execute, write outputs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use pte_runtime::{
    npy, BackendRegistry, EValue, LoadOptions, Method, Program, RuntimeError, ValueMeta,
};

#[derive(clap::Args)]
pub struct RunArgs {
    model: PathBuf,
    /// A .ptd file with data the program uses (repeatable).
    #[arg(long)]
    data: Vec<PathBuf>,
    /// The method to run (default: forward, else the first).
    #[arg(long)]
    method: Option<String>,
    /// An input .npy file, in the method's input order (repeatable).
    #[arg(long = "input")]
    inputs: Vec<PathBuf>,
    /// Write the outputs as .npy files into this directory.
    #[arg(long, value_name = "DIR")]
    outputs: Option<PathBuf>,
    /// Execute the loaded method this many times (state persists); outputs are the last
    /// execution's.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
}

pub fn describe_meta(m: &ValueMeta) -> String {
    match m {
        ValueMeta::Tensor(t) => format!("{}{:?}", t.dtype, t.sizes),
        other => format!("{other:?}"),
    }
}

/// A short text for an output: dtype, shape and the first few values.
fn summary(v: &EValue) -> String {
    match v {
        EValue::Tensor(t) => {
            let values = t
                .to_f64_vec()
                .map(|v| {
                    let shown: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
                    let more = if v.len() > 6 { ", ..." } else { "" };
                    format!("[{}{more}]", shown.join(", "))
                })
                .unwrap_or_default();
            format!("{} {:?} {values}", t.dtype(), t.sizes())
        }
        other => format!("{other:?}"),
    }
}

/// Opens a program with its data files and loads a method (default: `forward`, else the
/// first), with the standard kernels and options.
pub fn load(
    model: &Path,
    data: &[PathBuf],
    method: Option<&str>,
    options: &LoadOptions,
) -> Result<(String, Method)> {
    let mut program =
        Program::open(model).with_context(|| format!("loading {}", model.display()))?;
    for d in data {
        program
            .add_data_file(d)
            .with_context(|| format!("loading data file {}", d.display()))?;
    }
    let name = match method {
        Some(m) => m.to_owned(),
        None => {
            let names = program.method_names();
            if names.iter().any(|n| n == "forward") {
                "forward".to_owned()
            } else {
                names
                    .first()
                    .cloned()
                    .context("the program has no methods")?
            }
        }
    };
    let method = program
        .load_method_with(
            &name,
            &pte_kernels::registry(),
            &BackendRegistry::new(),
            options,
        )
        .map_err(|e| {
            let hint = match e {
                RuntimeError::ExternalData(_) if data.is_empty() => {
                    " (give data files with --data FILE.ptd)"
                }
                _ => "",
            };
            anyhow::Error::new(e).context(format!("loading method {name:?}{hint}"))
        })?;
    Ok((name, method))
}

pub fn run(a: RunArgs) -> Result<()> {
    let started = Instant::now();
    let (method_name, mut method) = load(
        &a.model,
        &a.data,
        a.method.as_deref(),
        &LoadOptions::default(),
    )?;
    let load_time = started.elapsed();
    let meta = method.meta().clone();

    let inputs: Vec<EValue> = if a.inputs.is_empty() {
        meta.example_inputs()?
    } else {
        if a.inputs.len() != meta.inputs.len() {
            bail!(
                "method {method_name:?} takes {} inputs ({}), got {} --input files",
                meta.inputs.len(),
                meta.inputs
                    .iter()
                    .map(describe_meta)
                    .collect::<Vec<_>>()
                    .join(", "),
                a.inputs.len()
            );
        }
        a.inputs
            .iter()
            .zip(&meta.inputs)
            .map(|(p, m)| npy::read_input(p, m).map_err(anyhow::Error::from))
            .collect::<Result<_>>()?
    };
    let mut times = Vec::with_capacity(a.repeat);
    for _ in 0..a.repeat.max(1) {
        method.set_inputs(&inputs)?;
        let t = Instant::now();
        method.execute()?;
        times.push(t.elapsed());
    }
    let outputs = method.outputs()?;

    println!(
        "{}: method {method_name:?}, loaded in {:.2} ms",
        a.model.display(),
        load_time.as_secs_f64() * 1e3
    );
    if a.inputs.is_empty() {
        println!(
            "inputs: generated ({})",
            meta.inputs
                .iter()
                .map(describe_meta)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let first = times[0].as_secs_f64() * 1e3;
    if times.len() > 1 {
        let mut rest: Vec<f64> = times[1..].iter().map(|t| t.as_secs_f64() * 1e3).collect();
        rest.sort_by(f64::total_cmp);
        println!(
            "executed {} times: first {first:.3} ms, then median {:.3} ms (min {:.3})",
            times.len(),
            rest[rest.len() / 2],
            rest[0]
        );
    } else {
        println!("executed in {first:.3} ms");
    }
    for (i, v) in outputs.iter().enumerate() {
        println!("  output {i}: {}", summary(v));
    }
    if let Some(dir) = &a.outputs {
        write_outputs(dir, &outputs)?;
        println!("wrote {} outputs to {}", outputs.len(), dir.display());
    }
    Ok(())
}

fn write_outputs(dir: &Path, outputs: &[EValue]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (i, v) in outputs.iter().enumerate() {
        npy::write_value(dir.join(format!("{i}.npy")), v)?;
    }
    Ok(())
}
