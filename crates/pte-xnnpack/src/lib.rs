//! The `XnnpackBackend` delegate for pte: XNNPACK payloads exported by upstream
//! ExecuTorch's XNNPACK partitioner, parsed, validated, prepared and run on pte-compute
//! kernels, in Rust, without the XNNPACK C library.
//!
//! Register [`XnnpackBackend`] in a [`pte_runtime::BackendRegistry`] (see [`register`])
//! and programs whose heavy parts were delegated to XNNPACK load and run:
//!
//! ```no_run
//! use pte_runtime::{BackendRegistry, LoadOptions, Program};
//! let program = Program::open("mobilenet_xnnpack.pte")?;
//! let mut backends = BackendRegistry::new();
//! pte_xnnpack::register(&mut backends);
//! let method = program.load_method_with("forward", &pte_kernels::registry(), &backends, &LoadOptions::default())?;
//! # Ok::<(), pte_runtime::RuntimeError>(())
//! ```
//!
//! When a method loads, each delegate's payload (an `XH00` header or a bare flatbuffer,
//! identifier `XN00` or `XN01`) is read and validated completely before anything runs:
//! value ids, shapes, datatypes, quantization parameters, constant sizes against their
//! tensors, graph inputs and outputs against the delegate call's arguments; every error
//! names the payload field, value or node. Each node is then prepared once: weights
//! packed into the layout its kernel reads (constants are otherwise read in place from
//! the program or `.ptd` file), output bounds folded into its epilogue, shapes inferred,
//! and memory planned so that values that are never alive together share it. A SiLU
//! exported as `Sigmoid` and `Multiply` runs as one operation, inside the epilogue of
//! the fp32 convolution or fully connected node producing its input when nothing else
//! reads that value. A Clamp node merges into the node producing its input, as
//! XNNPACK's subgraph optimization merges it. An fp32 inverted residual block (1×1
//! expansion, depthwise, 1×1 projection, residual addition, any of the pointwise
//! layers at least) becomes one node that runs band by band of rows, its expanded
//! values kept in cache, as the plain programs' NHWC regions run it. 8-bit convolutions and fully connected
//! nodes run pte-compute's 8-bit kernels (`pte_compute::qconv`: AVX-512 VNNI products
//! requantized in their store, depthwise rows over blocks of channels). All prepared
//! state is charged to the method's memory budget.
//!
//! At each call the graph runs on the method's thread pool; when the input shapes
//! change (dynamic shapes), shapes are inferred again and memory re-planned.
//!
//! Supported: the 47 node kinds of the schema for fp32 and fp16 values (fp16 and bf16
//! are computed in f32 and rounded at each node's output, as XNNPACK's f16 kernels do
//! on x86), and the quantized kinds upstream's quantizers produce: qint8 / quint8
//! per-tensor activations, qcint8 / qcint32 per-channel weights and biases, qdint8
//! activations quantized at run time per row, qcint4 per-channel and qbint4 blockwise
//! weights. Quantized arithmetic follows XNNPACK's (fp32 requantization with round
//! half to even, its fixed-point quantized addition, its dynamic quantization
//! parameters). Not supported: XNNPACK-internal packed datatypes (`qpint8`, `pfp32`).
//!
//! See `docs/security.md` for what a hostile payload can and cannot do.

// No `unsafe` in this crate's own code; the generated bindings (`schema`) use planus's
// unsafe trait implementations, as pte-format's do.
#![deny(unsafe_code)]
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)]

mod error;
mod exec;
mod fuse;
mod graph;
mod ops;
pub mod payload;
mod summary;

/// Generated flatbuffer bindings (planus) for the XNNGraph schema.
#[allow(
    unsafe_code,
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unused_imports,
    rustdoc::all
)]
pub mod schema {
    include!("generated.rs");
}

use std::sync::Arc;

use pte_runtime::{
    ArgDecl, Args, Backend, BackendRegistry, DType, DelegateInit, KernelResult, PartProfile,
    PreparedKernel,
};

pub use error::{Result, XnnError};
pub use graph::{Datatype, Graph};
pub use summary::{summarize, Summary};

/// The id upstream gives the backend (`BackendDelegate.id`).
pub const BACKEND_ID: &str = "XnnpackBackend";

/// The XNNPACK backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct XnnpackBackend;

/// Registers [`XnnpackBackend`] under its upstream id.
pub fn register(backends: &mut BackendRegistry) {
    backends.register(BACKEND_ID, XnnpackBackend);
}

/// One delegate, prepared.
struct Delegate {
    exec: exec::Exec,
    /// Argument positions of the graph's outputs, the only ones a call writes.
    written: Vec<usize>,
}

impl PreparedKernel for Delegate {
    fn run(&mut self, args: &mut Args<'_>) -> KernelResult {
        self.exec.run(args)
    }

    fn written(&self) -> Option<&[usize]> {
        Some(&self.written)
    }

    fn set_profiling(&mut self, on: bool) {
        self.exec.set_profiling(on);
    }

    fn profile(&self) -> Vec<PartProfile> {
        self.exec.profile()
    }
}

/// Checks the graph's inputs and outputs against a call's arguments and gives the
/// argument dtypes by external id.
fn check_call(graph: &Graph, args: &[ArgDecl]) -> Result<Vec<Option<DType>>> {
    if args.len() < graph.num_externs as usize {
        return Err(XnnError::Arguments(format!(
            "the call passes {} arguments, the graph has {} inputs and outputs",
            args.len(),
            graph.num_externs
        )));
    }
    let mut dtypes = vec![None; args.len()];
    for &i in graph.inputs.iter().chain(&graph.outputs) {
        let Some(v) = graph.values.get(i) else {
            continue;
        };
        let ext = v.external.unwrap_or(0) as usize;
        match args.get(ext) {
            Some(ArgDecl::Tensor { info, dynamism }) => {
                let physical: graph::Dims = info
                    .dim_order
                    .iter()
                    .map(|&d| info.sizes.get(d).copied().unwrap_or(0))
                    .collect();
                // Upstream serializes 0-d tensors with dims [1].
                let scalar = physical.is_empty() && v.dims.as_slice() == [1];
                let static_mismatch = *dynamism == pte_runtime::Dynamism::Static
                    && v.is_input
                    && physical.as_slice() != v.dims.as_slice();
                if !scalar && (physical.len() != v.dims.len() || static_mismatch) {
                    return Err(XnnError::Arguments(format!(
                        "value {} has dims {:?}, argument {ext} is {:?} (in dim order {:?})",
                        v.id, v.dims, info.sizes, info.dim_order
                    )));
                }
                if let Some(d) = dtypes.get_mut(ext) {
                    *d = Some(info.dtype);
                }
            }
            Some(ArgDecl::Other(kind)) => {
                return Err(XnnError::Arguments(format!(
                    "value {} is bound to argument {ext}, which is {kind}, not a tensor",
                    v.id
                )))
            }
            None => {
                return Err(XnnError::Arguments(format!(
                    "value {} is bound to argument {ext}, past the call's {} arguments",
                    v.id,
                    args.len()
                )))
            }
        }
    }
    Ok(dtypes)
}

impl Backend for XnnpackBackend {
    fn init(&self, init: &DelegateInit<'_>) -> KernelResult<Box<dyn PreparedKernel>> {
        let mut graph = Graph::parse(&init.processed, init.named_data)?;
        // Every call of the delegate must fit the graph; the first one's dtypes decide
        // how values cross the boundary.
        let mut dtypes: Option<Vec<Option<DType>>> = None;
        for call in init.calls {
            let d = check_call(&graph, &call.args)?;
            match &dtypes {
                Some(first) if *first != d => {
                    return Err(XnnError::Arguments(format!(
                        "the call at chain {} instruction {} passes other dtypes than the first",
                        call.chain, call.instruction
                    ))
                    .into())
                }
                Some(_) => {}
                None => dtypes = Some(d),
            }
        }
        let dtypes = dtypes.unwrap_or_else(|| {
            // A delegate nothing calls: assume the payload's own types.
            let mut d = vec![None; graph.num_externs as usize];
            for v in &graph.values {
                if let Some(slot) = v.external.and_then(|e| d.get_mut(e as usize)) {
                    *slot = match v.dtype {
                        Datatype::F32 => Some(DType::F32),
                        Datatype::F16 => Some(DType::F16),
                        Datatype::Bf16 => Some(DType::BF16),
                        Datatype::QInt8 => Some(DType::I8),
                        Datatype::QUInt8 => Some(DType::U8),
                        _ => Some(DType::I32),
                    };
                }
            }
            d
        });
        fuse::fuse(&mut graph);
        let exec = exec::Exec::new(
            &graph,
            &dtypes,
            init.budget,
            Arc::clone(init.pool),
            init.workspace.clone(),
            init.derived,
        )?;
        let mut written: Vec<usize> = graph
            .outputs
            .iter()
            .filter_map(|&i| Some(graph.values.get(i)?.external? as usize))
            .collect();
        written.sort_unstable();
        written.dedup();
        Ok(Box::new(Delegate { exec, written }))
    }
}
