//! The ahead-of-time compiler: `torch.export` archives (`.pt2`) to ExecuTorch programs
//! (`.pte`) and external data (`.ptd`), without Python.
//!
//! [`compile`] runs the stages upstream's `to_edge` and `to_executorch` run, each a small
//! pass over one graph representation ([`ir::Graph`]):
//!
//! 1. [`archive::read`] reads the zip archive (untrusted: every size, path and view is
//!    checked) and [`import::import`] builds one graph per exported program;
//! 2. `functionalize` removes in-place operators and views, `decompose` rewrites the
//!    operators `torch.export` leaves into core ATen as `to_edge` does;
//! 3. `edge` applies the Edge dialect's rules (scalars to tensors, dim-order operators);
//! 4. `out_variant` switches to `.out` operators and `plan` places every tensor in one
//!    arena;
//! 5. `emit` writes the program with [`pte_format::ProgramImage`].
//!
//! [`Stage`] names the points after which [`Compiler::print`] shows a graph.
//!
//! What it does not do: delegate to backends, quantize, or run PyTorch code; operators with
//! no decomposition and no kernel are reported together in one error
//! ([`CompileError::NoDecomposition`]).

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)]
#![forbid(unsafe_code)]

pub mod archive;
pub mod dtype;
mod error;
pub mod import;
pub mod ir;
pub mod schema;
pub mod sym;

pub use error::{CompileError, Result};
pub mod emit;
pub mod passes;
pub mod print;

use std::fmt;
use std::str::FromStr;

pub use archive::ArchiveLimits;
pub use emit::ConstantPlacement;
pub use import::Program;
pub use passes::plan::MemoryPlan;

/// The points after which a graph can be shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// As read from the archive.
    Export,
    /// After functionalization and decomposition into core ATen.
    Core,
    /// In the Edge dialect (views as `_copy`, scalars as tensors, dim-order operators).
    Edge,
    /// With `.out` operators and planned memory, as emitted.
    Planned,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 4] = [Stage::Export, Stage::Core, Stage::Edge, Stage::Planned];

    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Export => "export",
            Stage::Core => "core",
            Stage::Edge => "edge",
            Stage::Planned => "planned",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Stage {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Stage::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
                format!("unknown stage {s:?} (one of: {})", names.join(", "))
            })
    }
}

/// Options of [`compile`].
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Where constants go.
    pub constants: ConstantPlacement,
    /// Layout of the written files.
    pub write: pte_format::WriteOptions,
    /// Limits on reading the archive.
    pub limits: ArchiveLimits,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            constants: ConstantPlacement::Program,
            write: pte_format::WriteOptions::default(),
            limits: ArchiveLimits::default(),
        }
    }
}

/// What one method's memory plan came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodReport {
    /// Method name.
    pub name: String,
    /// Bytes of the planned arena.
    pub planned_bytes: u64,
    /// Bytes upstream's greedy planner would need for the same tensors.
    pub upstream_greedy_bytes: u64,
    /// Instructions' operators, sorted, with `.out` overloads.
    pub operators: Vec<String>,
}

/// A compiled program.
pub struct Compiled {
    /// The `.pte` bytes.
    pub pte: Vec<u8>,
    /// The `.ptd` bytes, when constants are external.
    pub ptd: Option<Vec<u8>>,
    /// One report per method.
    pub methods: Vec<MethodReport>,
}

/// The methods of an archive, taken through the passes one stage at a time.
pub struct Compiler {
    programs: Vec<Program>,
    plans: Vec<MemoryPlan>,
    stage: Stage,
}

impl Compiler {
    /// Reads an archive (every exported program becomes a method; a single program named
    /// `model`, as `torch.export.save` writes it, becomes `forward`).
    pub fn new(archive: &[u8], limits: &ArchiveLimits) -> Result<Self> {
        let mut a = archive::read(archive, limits)?;
        let single = a.models.len() == 1;
        let programs = a
            .models
            .iter_mut()
            .map(|m| {
                let name = if single && m.name == "model" {
                    "forward".to_owned()
                } else {
                    m.name.clone()
                };
                import::import(m, &name)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Compiler {
            programs,
            plans: Vec::new(),
            stage: Stage::Export,
        })
    }

    /// Runs the passes up to and including `stage`.
    pub fn run_to(&mut self, stage: Stage) -> Result<()> {
        while self.stage < stage {
            match self.stage {
                Stage::Export => {
                    for p in &mut self.programs {
                        passes::functionalize::run(p)?;
                        passes::decompose::run(p)?;
                    }
                    self.stage = Stage::Core;
                }
                Stage::Core => {
                    for p in &mut self.programs {
                        passes::edge::run(p)?;
                    }
                    self.stage = Stage::Edge;
                }
                Stage::Edge => {
                    self.plans.clear();
                    for p in &mut self.programs {
                        passes::out_variant::run(p)?;
                        self.plans.push(passes::plan::run(p)?);
                    }
                    self.stage = Stage::Planned;
                }
                Stage::Planned => break,
            }
        }
        Ok(())
    }

    /// The graphs of every method at the current stage, as text.
    pub fn print(&self) -> String {
        self.programs
            .iter()
            .enumerate()
            .map(|(i, p)| print::program(p, self.plans.get(i)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Emits the program (running the remaining passes first).
    pub fn finish(mut self, options: &CompileOptions) -> Result<Compiled> {
        self.run_to(Stage::Planned)?;
        let reports = self
            .programs
            .iter()
            .zip(&self.plans)
            .map(|(p, plan)| MethodReport {
                name: p.name.clone(),
                planned_bytes: plan.total,
                upstream_greedy_bytes: plan.upstream_greedy_total,
                operators: operators(&p.graph.nodes),
            })
            .collect();
        let methods: Vec<(Program, MemoryPlan)> =
            self.programs.into_iter().zip(self.plans).collect();
        let out = emit::emit(methods, options.constants, &options.write)?;
        Ok(Compiled {
            pte: out.pte,
            ptd: out.ptd,
            methods: reports,
        })
    }
}

fn operators(nodes: &[ir::Node]) -> Vec<String> {
    let mut set = std::collections::BTreeSet::new();
    fn walk(nodes: &[ir::Node], set: &mut std::collections::BTreeSet<String>) {
        for n in nodes {
            if !n.op.is_cond() {
                set.insert(n.op.key());
            }
            for a in &n.args {
                if let ir::Arg::Block(b) = a {
                    walk(&b.nodes, set);
                }
            }
        }
    }
    walk(nodes, &mut set);
    set.into_iter().collect()
}

/// Compiles an archive's bytes to a program.
pub fn compile(archive: &[u8], options: &CompileOptions) -> Result<Compiled> {
    Compiler::new(archive, &options.limits)?.finish(options)
}
