//! A delegate's packed weights leave the resident set of a mapped program: once the
//! kernels hold their copies, the pages of the file's copy are given back, and the
//! outputs are the same bits as from a program read into memory. A filter read in
//! place (at least `IN_PLACE_WEIGHT_BYTES`) keeps its pages.
#![cfg(target_os = "linux")]

mod common;

use common::{fc_program, run_program};
use pte_format::FileBytes;
use pte_runtime::Program;
use pte_testkit::{resident_bytes_of, values, TempFile};

/// The output of `program` on `input`, as bits.
fn outputs(program: &Program, input: &[f32], dims: &[usize]) -> Vec<u32> {
    let (out, _) = run_program(program, dims, input, 1);
    out.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn packed_filters_leave_a_mapped_file_resident_no_more() {
    let (m, n, k) = (3, 1000, 600);
    let (w, bias, input) = (values(n * k, 1), values(n, 2), values(m * k, 3));
    // Stored [k, n] (XNNPACK's transposed flag): packed at load whatever its size.
    let bytes = fc_program(m, (n, k), &w, &bias, true);
    let file = TempFile::new("pte-xnnpack-resident.pte", &bytes).unwrap();
    // SAFETY: the file is this test's own; nothing writes it while it is mapped.
    let mapped = Program::from_file(unsafe { FileBytes::map(file.path()) }.unwrap()).unwrap();
    let want = outputs(&Program::from_bytes(&bytes).unwrap(), &input, &[m, k]);
    let got = outputs(&mapped, &input, &[m, k]);
    let left = resident_bytes_of(file.path());
    assert!(
        left < n * k * 4 / 8,
        "{left} bytes of the mapped file resident after packing a {} byte filter",
        n * k * 4
    );
    assert_eq!(got, want, "outputs of the mapped program");
    assert_eq!(
        outputs(&mapped, &input, &[m, k]),
        want,
        "outputs of a second load"
    );
}
