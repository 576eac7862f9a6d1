//! `pte compile`: a torch.export archive to a program (and its external constants).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use pte_compiler::{CompileOptions, Compiler, ConstantPlacement, Stage};

/// Arguments of `pte compile`.
#[derive(Args)]
pub struct CompileArgs {
    /// The archive written by `torch.export.save` (torch 2.15).
    model: PathBuf,
    /// Where to write the program.
    #[arg(short, long, value_name = "OUT.pte")]
    output: PathBuf,
    /// Write every constant tensor to this .ptd file instead of the program.
    #[arg(long, value_name = "OUT.ptd")]
    external_constants: Option<PathBuf>,
    /// Alignment of segments in the output (a power of two; 4096 aligns to pages).
    #[arg(long, default_value_t = 128)]
    segment_alignment: u64,
    /// Print the graph after a stage: export, core, edge or planned.
    #[arg(long, value_name = "STAGE")]
    print: Option<Stage>,
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

pub fn run(args: CompileArgs) -> Result<()> {
    let bytes =
        std::fs::read(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let mut options = CompileOptions::default();
    options.write.segment_alignment = args.segment_alignment;
    if args.external_constants.is_some() {
        options.constants = ConstantPlacement::External;
    }
    let start = std::time::Instant::now();
    let mut compiler = Compiler::new(&bytes, &options.limits)
        .with_context(|| format!("reading {}", args.model.display()))?;
    if let Some(stage) = args.print {
        compiler.run_to(stage)?;
        print!("{}", compiler.print());
    }
    let out = compiler.finish(&options)?;
    write(&args.output, &out.pte)?;
    match (&args.external_constants, &out.ptd) {
        (Some(path), Some(ptd)) => write(path, ptd)?,
        (Some(path), None) => eprintln!(
            "the program has no constants: {} not written; load the program alone",
            path.display()
        ),
        _ => {}
    }
    for m in &out.methods {
        eprintln!(
            "method {}: {} operators, planned memory {} bytes (upstream's greedy planner: {} bytes)",
            m.name,
            m.operators.len(),
            m.planned_bytes,
            m.upstream_greedy_bytes
        );
    }
    eprintln!(
        "wrote {} ({} bytes) in {:.3} s",
        args.output.display(),
        out.pte.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
