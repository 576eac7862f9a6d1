//! Pieces the tests share: XNNPACK graph values written by hand, and methods loaded
//! with the XNNPACK backend registered.

use pte_runtime::{BackendRegistry, LoadOptions, Method, Program};
use pte_xnnpack::schema::fb_xnnpack as x;

/// Value `id`: fp32 of `dims`, constant entry `constant` (0: none), and an external id
/// with its input (1) or output (2) flag.
pub fn tensor(id: u32, dims: &[usize], constant: u32, external: Option<(u32, u32)>) -> x::XValue {
    let (external_id, flags) = external.unwrap_or((u32::MAX, 0));
    x::XValue {
        xvalue_union: Some(x::XValueUnion::XnnTensorValue(Box::new(
            x::XnnTensorValue {
                datatype: x::XnnDatatype::XnnDatatypeFp32,
                num_dims: dims.len() as u32,
                dims: Some(dims.iter().map(|&d| d as u32).collect()),
                constant_buffer_idx: constant,
                external_id,
                flags,
                id_out: id,
                dq_datatype: x::XnnDatatype::XnnDatatypeInvalid,
            },
        ))),
    }
}

/// Method "forward" of `program`, its delegates run by pte's XNNPACK backend on
/// `threads` threads.
pub fn load(program: &Program, threads: usize) -> Method {
    let mut backends = BackendRegistry::new();
    pte_xnnpack::register(&mut backends);
    let options = LoadOptions {
        threads: Some(threads),
        ..LoadOptions::default()
    };
    program
        .load_method_with("forward", &pte_kernels::registry(), &backends, &options)
        .unwrap()
}
