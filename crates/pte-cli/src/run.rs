//! `pte run`: load a program, set inputs, execute, write outputs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pte_format::FileBytes;
use pte_runtime::{
    npy, BackendRegistry, EValue, LoadOptions, Method, Program, RuntimeError, ValueMeta,
};

/// What `run` and `bench` share: the program, its data, the method, and the limits it
/// runs under.
#[derive(clap::Args)]
pub struct ProgramArgs {
    /// The program (.pte, or a .bpte bundle).
    pub model: PathBuf,
    /// A .ptd file with data the program uses (repeatable).
    #[arg(long)]
    pub data: Vec<PathBuf>,
    /// The method (default: forward, else the first).
    #[arg(long)]
    pub method: Option<String>,
    /// Most memory the method may hold, in bytes or with a K, M or G suffix (default: half
    /// of the memory this process may use).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
    /// Stop an execution that runs longer than this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Memory-map the program and data files instead of reading them. Faster to open
    /// large files, and the file's copy of weights packed at load stops counting as
    /// resident memory (its pages are given back); the files must not change while
    /// pte runs.
    #[arg(long)]
    pub mmap: bool,
}

/// Parses a byte count such as `4096`, `512M` or `8G`.
fn parse_bytes(text: &str) -> std::result::Result<u64, String> {
    let (digits, unit) = match text
        .trim()
        .char_indices()
        .find(|(_, c)| !c.is_ascii_digit())
    {
        Some((i, _)) => text.trim().split_at(i),
        None => (text.trim(), ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => return Err(format!("unknown unit {other:?} (use K, M, G or T)")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{text:?} is not a byte count"))
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    program: ProgramArgs,
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
/// first) with the standard kernels, under the limits `args` gives.
pub fn load(args: &ProgramArgs, threads: Option<usize>) -> Result<(String, Method)> {
    let open = |path: &Path| -> Result<FileBytes> {
        let bytes = if args.mmap {
            // SAFETY: --mmap documents that the files must not change while pte runs.
            #[allow(unsafe_code)]
            unsafe {
                FileBytes::map(path)
            }
        } else {
            FileBytes::read(path)
        };
        bytes.with_context(|| format!("reading {}", path.display()))
    };
    let model = &args.model;
    let mut program =
        Program::from_file(open(model)?).with_context(|| format!("loading {}", model.display()))?;
    for d in &args.data {
        program
            .add_data(open(d)?)
            .with_context(|| format!("loading data file {}", d.display()))?;
    }
    let name = match &args.method {
        Some(m) => m.clone(),
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
    let mut options = LoadOptions {
        threads,
        ..LoadOptions::default()
    };
    if let Some(limit) = args.memory_limit {
        options.memory_limit = limit;
    }
    let mut method = program
        .load_method_with(&name, &pte_kernels::registry(), &backends(), &options)
        .map_err(|e| {
            let hint = match e {
                RuntimeError::ExternalData(_) if args.data.is_empty() => {
                    " (give data files with --data FILE.ptd)"
                }
                _ => "",
            };
            anyhow::Error::new(e).context(format!("loading method {name:?}{hint}"))
        })?;
    if let Some(seconds) = args.timeout {
        let timeout = Duration::try_from_secs_f64(seconds)
            .with_context(|| format!("--timeout {seconds} is not a duration"))?;
        method.set_timeout(Some(timeout));
    }
    Ok((name, method))
}

/// Inputs generated from the method's metadata, within its memory limit.
pub fn example_inputs(method: &Method) -> Result<Vec<EValue>> {
    let (_, limit) = method.memory_used();
    Ok(method.meta().example_inputs(limit)?)
}

pub fn run(a: RunArgs) -> Result<()> {
    let started = Instant::now();
    let (method_name, mut method) = load(&a.program, None)?;
    let load_time = started.elapsed();
    let meta = method.meta().clone();

    let inputs: Vec<EValue> = if a.inputs.is_empty() {
        example_inputs(&method)?
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
        a.program.model.display(),
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
    let ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    match ms.split_first() {
        Some((first, rest)) if !rest.is_empty() => {
            let mut rest = rest.to_vec();
            rest.sort_by(f64::total_cmp);
            println!(
                "executed {} times: first {first:.3} ms, then median {:.3} ms (min {:.3})",
                ms.len(),
                rest.get(rest.len() / 2).copied().unwrap_or_default(),
                rest.first().copied().unwrap_or_default()
            );
        }
        Some((first, _)) => println!("executed in {first:.3} ms"),
        None => {}
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

/// The backends this build runs delegates with.
pub(crate) fn backends() -> BackendRegistry {
    let mut b = BackendRegistry::new();
    pte_xnnpack::register(&mut b);
    b
}
