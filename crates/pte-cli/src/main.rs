//! The `pte` command line: a thin layer over the `pte-format`, `pte-runtime`,
//! `pte-kernels` and `pte-xnnpack` crates.

// Two uses of `unsafe`, each allowed where it is: mapping files for `--mmap`, and the
// counting global allocator.
#![deny(unsafe_code)]

mod alloc_count;
mod bench;
mod compile;
mod inspect;
mod ops;
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
    about = "Compile, inspect, rewrite and run ExecuTorch programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a .pte, .ptd or .bpte file holds: header, segments, methods with their
    /// inputs, outputs, operators (marking those this build has no kernel for), delegates,
    /// planned memory and constants.
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
    Run(run::RunArgs),
    /// Time repeated executions of a method on generated inputs.
    Bench(bench::BenchArgs),
    /// Compile a torch.export archive (.pt2, torch 2.15) to a program.
    Compile(compile::CompileArgs),
    /// List the operators this build has kernels for, sorted, one per line.
    Ops {
        /// Print a JSON array of strings instead.
        #[arg(long)]
        json: bool,
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
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Ops { json } => ops::run(json),
        Command::Compile(args) => compile::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, joined by ": ". Our error types show their source in
/// their own message too, so a cause the message already ends with is not repeated.
fn report(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.ends_with(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::report;

    #[test]
    fn a_cause_is_reported_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(pte_format::FormatError::Io {
            path: "m.pte".into(),
            source: io,
        })
        .context("loading m.pte");
        assert_eq!(report(&e), "loading m.pte: cannot read m.pte: no such file");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(report(&plain), "outer: inner");
    }
}
