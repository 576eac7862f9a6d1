//! `pte bench`: time repeated executions of a loaded method.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use pte_runtime::{npy, EValue, Method, ValueMeta};
use serde::Serialize;

use crate::alloc_count;
use crate::run::{describe_meta, example_inputs, load, ProgramArgs};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    program: ProgramArgs,
    /// An input .npy file, in the method's input order (repeatable); default: inputs
    /// generated from the method's metadata.
    #[arg(long = "input")]
    inputs: Vec<PathBuf>,
    /// Untimed executions before measuring.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed executions.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// Threads for the method's kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Also time every operator and delegate call, and print where the time goes.
    #[arg(long)]
    profile: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Time spent in one operator or delegate, per execution.
#[derive(Serialize)]
struct ProfileRow {
    name: String,
    delegate: bool,
    calls_per_execution: f64,
    ms_per_execution: f64,
    share: f64,
    /// The parts of a delegate or fused kernel (node kinds, steps), if it times them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    parts: Vec<ProfileRow>,
}

impl ProfileRow {
    /// Per-execution figures of `calls` over `total` in `iterations` executions that
    /// took `total_ms` in all.
    fn new(
        name: String,
        delegate: bool,
        calls: u64,
        total: std::time::Duration,
        iterations: usize,
        total_ms: f64,
    ) -> Self {
        let ms = total.as_secs_f64() * 1e3;
        ProfileRow {
            name,
            delegate,
            calls_per_execution: calls as f64 / iterations as f64,
            ms_per_execution: ms / iterations as f64,
            share: if total_ms > 0.0 { ms / total_ms } else { 0.0 },
            parts: Vec::new(),
        }
    }
}

/// What `--json` prints.
#[derive(Serialize)]
struct Report {
    model: String,
    method: String,
    inputs: Vec<String>,
    threads: usize,
    load_ms: f64,
    first_ms: f64,
    iterations: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    p10_ms: f64,
    p90_ms: f64,
    planned_bytes: u64,
    memory_used_bytes: u64,
    peak_rss_bytes: Option<u64>,
    /// Resident memory before the program was opened (this binary and its libraries):
    /// what of the peak is not the program's.
    start_rss_bytes: Option<u64>,
    /// Heap allocations per timed execution (inputs set, execute), all threads.
    allocations_per_execution: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<Vec<ProfileRow>>,
}

/// Peak resident memory of this process (Linux: `VmHWM`), if the system says.
fn peak_rss() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Resident memory of this process now (Linux: `VmRSS`), if the system says.
fn rss() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// A size in kB from `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

fn inputs(a: &BenchArgs, method: &Method) -> Result<Vec<EValue>> {
    if a.inputs.is_empty() {
        return example_inputs(method);
    }
    let metas: &[ValueMeta] = &method.meta().inputs;
    if a.inputs.len() != metas.len() {
        bail!(
            "the method takes {} inputs ({}), got {} --input files",
            metas.len(),
            metas
                .iter()
                .map(describe_meta)
                .collect::<Vec<_>>()
                .join(", "),
            a.inputs.len()
        );
    }
    a.inputs
        .iter()
        .zip(metas)
        .map(|(p, m)| npy::read_input(p, m).map_err(anyhow::Error::from))
        .collect()
}

/// One execution: its time and the heap allocations it made.
fn execute(method: &mut Method, inputs: &[EValue]) -> Result<(Duration, u64)> {
    let allocations = alloc_count::allocations();
    let t = Instant::now();
    method.set_inputs(inputs)?;
    method.execute()?;
    let elapsed = t.elapsed();
    Ok((elapsed, alloc_count::allocations() - allocations))
}

pub fn run(a: BenchArgs) -> Result<()> {
    let start_rss_bytes = rss();
    let started = Instant::now();
    let (name, mut method) = load(&a.program, a.threads)?;
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let inputs = inputs(&a, &method)?;
    let (first, _) = execute(&mut method, &inputs)?;
    let first_ms = first.as_secs_f64() * 1e3;

    let iterations = a.iterations.max(1);
    let runs = (a.warmup + iterations) as u64;
    // A progress bar on a terminal, for runs expected to take over a second.
    let bar = (std::io::stderr().is_terminal() && first * runs as u32 > Duration::from_secs(1))
        .then(|| {
            let bar = indicatif::ProgressBar::new(runs);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} executions, {eta}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
    for _ in 0..a.warmup {
        execute(&mut method, &inputs)?;
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    method.set_profiling(a.profile);
    let mut times = Vec::with_capacity(iterations);
    let mut allocations = 0;
    for _ in 0..iterations {
        let (t, n) = execute(&mut method, &inputs)?;
        times.push(t.as_secs_f64() * 1e3);
        allocations += n;
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        let at = ((times.len() - 1) as f64 * p).round() as usize;
        times.get(at).copied().unwrap_or_default()
    };
    let total_ms: f64 = times.iter().sum();
    let profile = a.profile.then(|| {
        method
            .profile()
            .into_iter()
            .map(|e| {
                let mut row =
                    ProfileRow::new(e.name, e.delegate, e.calls, e.total, iterations, total_ms);
                row.parts = e
                    .parts
                    .into_iter()
                    .map(|p| ProfileRow::new(p.name, false, p.calls, p.total, iterations, total_ms))
                    .collect();
                row
            })
            .collect::<Vec<_>>()
    });
    let report = Report {
        model: a.program.model.display().to_string(),
        method: name,
        inputs: method.meta().inputs.iter().map(describe_meta).collect(),
        threads: a.threads.unwrap_or_else(default_threads),
        load_ms,
        first_ms,
        iterations,
        median_ms: pct(0.5),
        min_ms: pct(0.0),
        max_ms: pct(1.0),
        p10_ms: pct(0.1),
        p90_ms: pct(0.9),
        planned_bytes: method
            .meta()
            .planned_buffers
            .iter()
            .map(|&b| b as u64)
            .sum(),
        memory_used_bytes: method.memory_used().0,
        peak_rss_bytes: peak_rss(),
        start_rss_bytes,
        allocations_per_execution: allocations as f64 / iterations as f64,
        profile,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

fn print_text(r: &Report) {
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{} {:?} ({}), {} thread(s)",
        r.model,
        r.method,
        r.inputs.join(", "),
        r.threads
    );
    println!(
        "load {:.2} ms, first execution {:.3} ms",
        r.load_ms, r.first_ms
    );
    println!(
        "{} executions: median {:.3} ms, p10 {:.3} ms, p90 {:.3} ms, min {:.3} ms, max {:.3} ms",
        r.iterations, r.median_ms, r.p10_ms, r.p90_ms, r.min_ms, r.max_ms
    );
    print!(
        "memory: planned {:.1} MiB, held by the method {:.1} MiB",
        mb(r.planned_bytes),
        mb(r.memory_used_bytes)
    );
    match (r.peak_rss_bytes, r.start_rss_bytes) {
        (Some(p), Some(s)) => println!(
            ", peak resident {:.1} MiB ({:.1} MiB before the program was opened)",
            mb(p),
            mb(s)
        ),
        (Some(p), None) => println!(", peak resident {:.1} MiB", mb(p)),
        _ => println!(),
    }
    println!(
        "heap allocations per execution: {}",
        r.allocations_per_execution
    );
    if let Some(rows) = &r.profile {
        println!("\n{:>9} {:>7} {:>9}  operator", "ms/exec", "share", "calls");
        let line = |row: &ProfileRow, indent: &str| {
            println!(
                "{:>9.3} {:>6.1}% {:>9.1}  {indent}{}",
                row.ms_per_execution,
                row.share * 100.0,
                row.calls_per_execution,
                row.name
            );
        };
        for row in rows {
            line(row, "");
            for part in &row.parts {
                line(part, "  ");
            }
        }
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
