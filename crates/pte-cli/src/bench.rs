//! `pte bench`: time repeated executions of a loaded method.

use std::time::Instant;

use anyhow::Result;

use crate::run::{describe_meta, example_inputs, load, ProgramArgs};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    program: ProgramArgs,
    /// Untimed executions before measuring.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed executions.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// Threads for the method's kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(a: BenchArgs) -> Result<()> {
    let started = Instant::now();
    let (name, mut method) = load(&a.program, a.threads)?;
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let inputs = example_inputs(&method)?;
    let first = Instant::now();
    method.set_inputs(&inputs)?;
    method.execute()?;
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    for _ in 0..a.warmup {
        method.set_inputs(&inputs)?;
        method.execute()?;
    }
    let mut times = Vec::with_capacity(a.iterations);
    for _ in 0..a.iterations.max(1) {
        let t = Instant::now();
        method.set_inputs(&inputs)?;
        method.execute()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        let at = ((times.len() - 1) as f64 * p).round() as usize;
        times.get(at).copied().unwrap_or_default()
    };
    println!(
        "{} {name:?} ({}), {} thread(s)",
        a.program.model.display(),
        method
            .meta()
            .inputs
            .iter()
            .map(describe_meta)
            .collect::<Vec<_>>()
            .join(", "),
        a.threads.unwrap_or_else(rayon_threads)
    );
    println!("load {load_ms:.2} ms, first execution {first_ms:.3} ms");
    println!(
        "{} executions: median {:.3} ms, p10 {:.3} ms, p90 {:.3} ms, min {:.3} ms",
        times.len(),
        pct(0.5),
        pct(0.1),
        pct(0.9),
        pct(0.0)
    );
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
