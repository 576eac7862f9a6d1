//! Helpers shared by the integration tests that include this module.

use pte_runtime::{BackendRegistry, KernelRegistry, LoadOptions, Method, Program};

/// The method `forward` of a program, with `kernels` and no backend.
pub fn load(bytes: &[u8], kernels: &KernelRegistry) -> Method {
    Program::from_bytes(bytes)
        .unwrap()
        .load_method_with(
            "forward",
            kernels,
            &BackendRegistry::new(),
            &LoadOptions::default(),
        )
        .unwrap()
}
