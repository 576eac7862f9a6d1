//! A fully connected node whose fp32 filter is at least `IN_PLACE_WEIGHT_BYTES` reads it
//! where the program holds it (no packed copy): its outputs match the product computed
//! here in f64, for one row (dot products) and several (packed per call), and a
//! transposed filter of the same values (packed at load) matches too.

mod common;

use common::{fc_program, run_product};
use pte_compute::gemm::IN_PLACE_WEIGHT_BYTES;
use pte_testkit::values;

#[test]
fn a_filter_of_32_mib_is_read_in_place_with_the_same_results() {
    let (n, k) = (1024, 8192);
    assert!(n * k * 4 >= IN_PLACE_WEIGHT_BYTES);
    let scale = 1.0 / (k as f32).sqrt();
    let w: Vec<f32> = values(n * k, 1).iter().map(|v| v * scale).collect();
    let bias = values(n, 2);
    for m in [1, 3] {
        let input = values(m * k, 3 + m as u64);
        let expected: Vec<f64> = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                let row = &input[r * k..(r + 1) * k];
                let col = &w[c * k..(c + 1) * k];
                let dot: f64 = row
                    .iter()
                    .zip(col)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                dot + f64::from(bias[c])
            })
            .collect();
        for (transpose, threads) in [(false, 1), (false, 2), (true, 1)] {
            let bytes = fc_program(m, (n, k), &w, &bias, transpose);
            let (out, held) = run_product(&bytes, &[m, k], &input, threads);
            assert_eq!(out.len(), m * n);
            for (i, (&got, &want)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-4,
                    "m {m}, transposed {transpose}, {threads} threads: output {i} is {got}, not {want}"
                );
            }
            // In place: the method holds no copy of the filter; packed, it does.
            let packed = held as usize >= n * k * 4;
            assert_eq!(
                packed, transpose,
                "{held} bytes held (m {m}, transposed {transpose})"
            );
        }
    }
}
