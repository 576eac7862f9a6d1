//! Fully connected nodes that read the same fp32 filter share one packed copy, as an
//! unrolled recurrent network's steps do (upstream's partitioner gives each step a
//! delegate of its own, all reading one named weight): the method holds one copy, and
//! every node computes its product.

mod common;

use common::{product_program, run_product, tensor};
use pte_testkit::values;
use pte_xnnpack::schema::fb_xnnpack as x;

/// A program of one delegate applying `h ← h · wᵀ + bias` `steps` times, every node
/// reading filter value 1 and bias value 2.
fn program(steps: usize, k: usize, w: &[f32], bias: &[f32]) -> Vec<u8> {
    // Values: 0 the input, 1 the filter, 2 the bias, then one per step (the last is
    // the output).
    let mut xvalues = vec![
        tensor(0, &[1, k], 0, Some((0, 1))),
        tensor(1, &[k, k], 1, None),
        tensor(2, &[k], 2, None),
    ];
    let mut xnodes = Vec::new();
    for s in 0..steps {
        let out = 3 + s as u32;
        let last = s + 1 == steps;
        xvalues.push(tensor(out, &[1, k], 0, last.then_some((1, 2))));
        xnodes.push(x::XNode {
            xnode_union: Some(x::XNodeUnion::XnnFullyConnected(Box::new(
                x::XnnFullyConnected {
                    input1_id: if s == 0 { 0 } else { out - 1 },
                    filter_id: 1,
                    bias_id: 2,
                    output_id: out,
                    flags: 0,
                },
            ))),
            debug_handle: s as u32,
            output_min_max: None,
        });
    }
    product_program(
        xnodes,
        xvalues,
        2 + steps as u32,
        (w, bias),
        &[1, k],
        &[1, k],
    )
}

#[test]
fn nodes_reading_one_filter_share_its_packed_copy() {
    let k = 96;
    let scale = 1.0 / (k as f32).sqrt();
    let w: Vec<f32> = values(k * k, 1).iter().map(|v| v * scale).collect();
    let bias = values(k, 2);
    let input = values(k, 3);
    let run = |steps: usize| run_product(&program(steps, k, &w, &bias), &[1, k], &input, 1);
    let ((_, one), (out, eight)) = (run(1), run(8));
    // Seven more nodes hold their biases and values, not seven more packed filters.
    assert!(
        eight - one < (k * k * 4) as u64,
        "1 node holds {one} bytes, 8 nodes {eight}"
    );
    let mut h: Vec<f64> = input.iter().map(|&v| f64::from(v)).collect();
    for _ in 0..8 {
        h = (0..k)
            .map(|j| {
                let row = &w[j * k..(j + 1) * k];
                let dot: f64 = row.iter().zip(&h).map(|(&a, &b)| f64::from(a) * b).sum();
                dot + f64::from(bias[j])
            })
            .collect();
    }
    for (i, (&got, &want)) in out.iter().zip(&h).enumerate() {
        assert!(
            (f64::from(got) - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "output {i} is {got}, not {want}"
        );
    }
}
