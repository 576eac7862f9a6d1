//! Arbitrary bytes as a `.pt2` archive, compiled with small limits: any input must give a
//! program or an error, never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pte_compiler::{compile, ArchiveLimits, CompileOptions};

fuzz_target!(|data: &[u8]| {
    let options = CompileOptions {
        limits: ArchiveLimits {
            max_entries: 256,
            max_total_bytes: 64 << 20,
            max_json_bytes: 16 << 20,
        },
        ..Default::default()
    };
    let _ = compile(data, &options);
});
