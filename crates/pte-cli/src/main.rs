//! The `pte` command line: a thin layer over the `pte-format`, `pte-runtime` and
//! `pte-kernels` crates.

mod bench;
mod inspect;
mod repack;
mod run;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "pte",
    version,
    about = "Inspect, rewrite and run ExecuTorch programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a .pte, .ptd or .bpte file holds: header, segments, methods with their
    /// inputs, outputs, operators, delegates, planned memory and constants.
    Inspect {
        file: PathBuf,
        /// Print a JSON document (described in the README) instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Rewrite a program: re-align its segments, or move its constants to a .ptd file.
    Repack {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Alignment of segments in the output (a power of two; 4096 aligns to pages).
        #[arg(long, default_value_t = 128)]
        segment_alignment: u64,
        /// Move every constant tensor into this .ptd file; load the output with it.
        #[arg(long, value_name = "OUT.ptd")]
        external_constants: Option<PathBuf>,
    },
    /// Run a method of a program: inputs from .npy files (or generated from the method's
    /// metadata), outputs to DIR/0.npy, DIR/1.npy, ...
    Run {
        model: PathBuf,
        /// A .ptd file with data the program uses (repeatable).
        #[arg(long)]
        data: Vec<PathBuf>,
        /// The method to run (default: forward, else the first).
        #[arg(long)]
        method: Option<String>,
        /// An input .npy file, in the method's input order (repeatable).
        #[arg(long)]
        input: Vec<PathBuf>,
        /// Write the outputs as .npy files into this directory.
        #[arg(long, value_name = "DIR")]
        outputs: Option<PathBuf>,
        /// Execute the loaded method this many times (state persists); outputs are the
        /// last execution's.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// Time repeated executions of a method on generated inputs.
    Bench {
        model: PathBuf,
        #[arg(long)]
        data: Vec<PathBuf>,
        #[arg(long)]
        method: Option<String>,
        /// Untimed executions before measuring.
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        /// Timed executions.
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// Threads for the method's kernels (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect { file, json } => inspect::run(&file, json),
        Command::Repack {
            input,
            output,
            segment_alignment,
            external_constants,
        } => repack::run(
            &input,
            &output,
            segment_alignment,
            external_constants.as_deref(),
        ),
        Command::Run {
            model,
            data,
            method,
            input,
            outputs,
            repeat,
        } => run::run(run::RunArgs {
            model,
            data,
            method,
            inputs: input,
            outputs,
            repeat,
        }),
        Command::Bench {
            model,
            data,
            method,
            warmup,
            iterations,
            threads,
        } => bench::run(bench::BenchArgs {
            model,
            data,
            method,
            warmup,
            iterations,
            threads,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
