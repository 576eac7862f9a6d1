//! Load and execute arbitrary bytes as a program with the standard kernels. Seeded with
//! the fixtures, the fuzzer mostly produces programs that verify but are wrong inside:
//! bad indices, wrong value kinds, tensors outside their memory. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pte_runtime::{BackendRegistry, EValue, LoadOptions, Program};

/// Keeps one run small: planned memory, generated inputs and executed instructions are
/// capped (a loop under the default 10M-instruction cap is bounded, but slow under the
/// fuzzer's instrumentation).
const LIMIT_BYTES: u64 = 64 << 20;
const LIMIT_INSTRUCTIONS: u64 = 100_000;

fuzz_target!(|data: &[u8]| {
    let Ok(program) = Program::from_bytes(data) else { return };
    let kernels = pte_kernels::registry();
    let options = LoadOptions {
        memory_limit: LIMIT_BYTES,
        max_instructions: LIMIT_INSTRUCTIONS,
        ..LoadOptions::default()
    };
    for name in program.method_names().to_vec() {
        let Ok(meta) = program.method_meta(&name) else { continue };
        let Ok(mut method) =
            program.load_method_with(&name, &kernels, &BackendRegistry::new(), &options)
        else {
            continue;
        };
        let Ok(inputs) = meta.example_inputs(LIMIT_BYTES) else { continue };
        if method.set_inputs(&inputs).is_ok() {
            let _ = method.execute();
            let _: Vec<EValue> = method.outputs().unwrap_or_default();
        }
    }
});
