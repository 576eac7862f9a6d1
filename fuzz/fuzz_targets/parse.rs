//! Parse and verify arbitrary bytes as a .pte, .ptd or .bpte; when they pass, summarize
//! them and round-trip programs through the writer. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pte_format::{summary, Bpte, ProgramImage, Ptd, Pte, WriteOptions};

fn program(pte: &Pte<'_>) {
    let _ = summary::program(pte);
    if let Ok(image) = ProgramImage::from_pte(pte) {
        if let Ok(bytes) = image.to_bytes(&WriteOptions::default()) {
            Pte::parse(&bytes).expect("our own output must parse");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(pte) = Pte::parse(data) {
        program(&pte);
    }
    if let Ok(ptd) = Ptd::parse(data) {
        let _ = summary::data(&ptd);
    }
    if let Ok(bpte) = Bpte::parse(data) {
        let _ = summary::bundled(&bpte, data.len() as u64);
        program(bpte.program());
    }
});
